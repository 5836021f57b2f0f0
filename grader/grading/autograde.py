"""Grade one submission: sanitize with nbgrader, run sandboxed, score in this process.

nbgrader's own preprocessors restore the locked cells from the gradebook and strip the hidden
tests (the student's kernel never runs them, so it can never read an expected value); the
sandboxed run and the probes of grader/grading/probe.py decide the points; the gradebook and the
autograded notebook are written by the caller, one submission at a time.
"""

from __future__ import annotations

import ast
import copy
import functools
import io
import re
import tokenize
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat import NotebookNode
from nbformat.v4 import new_output

from grader.common import syntax
from grader.common.faults import Unavailable, database_name, is_database_error, retrying
from grader.common.text import inert, trusted_nbgrader_metadata
from grader.content.lessons import BEGIN_HIDDEN, END_HIDDEN, Lesson
from grader.content.variants import Draw, canonical
from grader.grading.execute import Run, run_submission
from grader.grading.kernel import GradingError
from grader.grading.limits import Limits
from grader.grading.plans import plan_for
from grader.grading.probe import Exercise, Verdict

# Code that reaches for the grader's machinery or outside its notebook. Not forbidden (the
# sandbox makes it harmless, the scoring outside the kernel makes it useless); flagged so that an
# instructor can look. A hint, not a defence: code can always hide what it reaches for.
SUSPICIOUS = {
    "builtins": r"\bbuiltins\b|__builtins__",
    "sys.modules": r"sys\s*\.\s*modules",
    "IPython's transformers or hooks": r"ast_transformers|input_transformers|"
                                       r"set_custom_exc|register_magic|events\s*\.\s*register|"
                                       r"displayhook|excepthook",
    "frames or globals": r"_getframe|\binspect\b|\bglobals\s*\(",
    "the file system": r"\bopen\s*\(|\bos\s*\.\s*(remove|unlink|rmdir|chdir|listdir|walk|"
                       r"scandir|system|popen|environ)|\bpathlib\b|\bshutil\b|\bglob\b",
    "subprocesses": r"\bsubprocess\b|\bos\s*\.\s*(fork|exec|spawn|kill|_exit)|"
                    r"\bmultiprocessing\b|\bsignal\b",
    # `requests` is also what lesson 08 calls a list of requests: as a module it must be imported
    # (the syntax tree below sees that), so only the import is looked for here.
    "the network": r"\b(import|from)[ \t]+(socket|urllib|requests|http|httpx)\b|"
                   r"\b(socket|urllib|httpx)\s*\.|\bhttp\.client\b",
    # [ \t]*, not \s*: at every line start \s* would rescan the newlines after it, quadratic
    # in a cell of many empty lines (and the regex engine holds the GIL, stalling every grader).
    "the check helper": r"^[ \t]*(def[ \t]+check\b|check[ \t]*=)|_difference",
}


HIDDEN_NOTE = "# (hidden checks, not shown: the grader runs them outside your notebook)"


@dataclass
class Graded:
    """The outcome of grading one student's submission."""

    student_id: str
    status: str  # graded, needs_review, invalid
    reasons: list[str] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    notebook: NotebookNode | None = None  # executed, hidden tests stripped: for feedback
    seconds: float = 0.0
    flags: list[str] = field(default_factory=list)
    notebook_sha256: str = ""  # of the notebook as handed in: a regrade of the same one is skipped
    drawn_for: str | None = None  # whose numbers it was graded on (a course id), where they vary
    drawn_with: str | None = None  # and the fingerprint of the key they were drawn with

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)[:1000]

    def outcome(self) -> dict[str, str]:
        """What the status file and the command's summary keep of it."""
        return {"status": self.status, "reason": self.reason,
                "notebook_sha256": self.notebook_sha256}


# The same, read from the code's syntax tree: a module imported under another name still counts.
MODULES = {
    "builtins": "builtins", "inspect": "frames or globals", "gc": "frames or globals",
    "ctypes": "frames or globals", "importlib": "sys.modules", "os": "the file system",
    "pathlib": "the file system", "shutil": "the file system", "glob": "the file system",
    "subprocess": "subprocesses", "multiprocessing": "subprocesses",
    "signal": "subprocesses", "pty": "subprocesses", "socket": "the network",
    "urllib": "the network", "http": "the network", "requests": "the network",
    "httpx": "the network",
}
DYNAMIC = {"getattr", "setattr", "__import__", "eval", "exec", "compile", "vars", "globals",
           "locals"}


def _syntax_flags(code: str) -> set[str]:
    try:
        tree = syntax.parse(code)
    except (SyntaxError, ValueError):
        return set()
    except (RecursionError, MemoryError):  # nested deeper than the parser goes
        return {"code nested too deeply for the grader to read"}
    flags = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            flags |= {MODULES[a.name.split(".")[0]] for a in node.names
                      if a.name.split(".")[0] in MODULES}
        elif isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split(".")[0]
            if root in MODULES:
                flags.add(MODULES[root])
        elif isinstance(node, ast.Name) and node.id in DYNAMIC:
            flags.add("names built at run time (getattr, eval, exec, __import__)")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("__") \
                and node.attr not in ("__init__", "__name__", "__class__", "__doc__"):
            flags.add("dunder attributes")
    return flags


MAX_SCANNED_CHARS = 2 * 2**20  # of a notebook's own code: beyond it, the rest is not read


def _without_prose(code: str) -> str:
    """The cell with its comments and plain string literals blanked (the rest of it unmoved):
    words in a docstring or a comment ("inspect the cache", "requests arrive") reach for
    nothing. An f-string is kept whole (its braces hold code), and text becomes code only through
    eval, exec, compile, getattr or __import__, which the syntax tree flags by name. A cell that
    does not tokenize (IPython's magics, a syntax error) is read as it is."""
    lines = code.splitlines(keepends=True)
    blanks = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(code).readline):
            prefix = re.match(r"[A-Za-z]*", token.string).group().lower()
            if token.type == tokenize.COMMENT or (token.type == tokenize.STRING
                                                  and "f" not in prefix):
                blanks.append((token.start, token.end))
    except (tokenize.TokenError, SyntaxError, ValueError, RecursionError, MemoryError):
        return code
    for (row, col), (end_row, end_col) in reversed(blanks):
        for line in range(row, end_row + 1):
            text = lines[line - 1]
            left = col if line == row else 0
            right = end_col if line == end_row else len(text.rstrip("\r\n"))
            lines[line - 1] = text[:left] + " " * (right - left) + text[right:]
    return "".join(lines)


def scan(nb: NotebookNode, source: NotebookNode) -> list[str]:
    """What the student's own code reaches for (cells that differ from the source notebook)."""
    given = {c.source for c in source.cells if c.cell_type == "code"}
    cells = [c.source for c in nb.cells if c.get("cell_type") == "code"
             and isinstance(c.get("source"), str) and c.source not in given]
    # The first MAX_SCANNED_CHARS of the cells, each with its prose blanked (lengths kept); a
    # cell cut at the limit is read as it is. Cells past it are not tokenized at all.
    parts, left = [], MAX_SCANNED_CHARS
    for cell in cells:
        if left <= 0:
            break
        parts.append(_without_prose(cell) if len(cell) <= left else cell[:left])
        left -= len(cell) + 1
    read = "\n".join(parts)[:MAX_SCANNED_CHARS]
    found = {what for what, pattern in SUSPICIOUS.items()
             if re.search(pattern, read, flags=re.MULTILINE)}
    for cell in cells:
        if len(cell) <= MAX_SCANNED_CHARS:
            found |= _syntax_flags(cell)
    if len(read) == MAX_SCANNED_CHARS:
        found.add(f"more than {MAX_SCANNED_CHARS // 2**20} MiB of code of its own (not all read)")
    return sorted(found)


def sanitize(nb: NotebookNode, lesson: Lesson, student_id: str, db_url: str,
             ) -> tuple[NotebookNode, list[str]]:
    """nbgrader's own clean-up of a submission, then the hidden tests removed."""
    from nbgrader.preprocessors import (
        CheckCellMetadata,
        ClearHiddenTests,
        ClearOutput,
        DeduplicateIds,
        OverwriteCells,
        OverwriteKernelspec,
    )

    resources = {"nbgrader": {"db_url": db_url, "assignment": lesson.name,
                              "notebook": lesson.notebook_id, "student": student_id}}
    notes = []
    cleaned = copy.deepcopy(nb)
    if _normalise(cleaned):
        notes.append("cells with metadata of the wrong shape were given plain metadata")
        nb = cleaned
    for step in (ClearOutput(), DeduplicateIds(), OverwriteKernelspec(), OverwriteCells(),
                 CheckCellMetadata()):
        try:
            cleaned, resources = step.preprocess(cleaned, resources)
        except Exception as error:  # edited metadata, say: grade what was submitted
            if is_database_error(error):  # the gradebook did not answer: not the notebook's
                raise
            notes.append(f"nbgrader's {type(step).__name__} refused the notebook "
                         f"({type(error).__name__}); graded as submitted")
            cleaned = copy.deepcopy(nb)
            cleaned, _ = ClearOutput().preprocess(cleaned, {})
            break
    _strip_hidden_everywhere(cleaned)
    cleaned, _ = ClearHiddenTests().preprocess(cleaned, resources)  # and whatever it knows more
    return cleaned, notes


def _normalise(nb: NotebookNode) -> bool:
    """Give every cell the shape nbgrader and the grader read: a metadata dict, nbgrader and
    course metadata dicts, a string source. True where something had to change."""
    changed = False
    for cell in nb.cells:
        if not isinstance(cell.get("metadata"), dict):
            cell["metadata"], changed = nbformat.from_dict({}), True
        for key in ("nbgrader", "course"):
            if key in cell.metadata and not isinstance(cell.metadata[key], dict):
                del cell.metadata[key]
                changed = True
        meta = cell.metadata.get("nbgrader", {})
        if meta and not trusted_nbgrader_metadata(meta):
            del cell.metadata["nbgrader"]  # nothing of it can be trusted, read or shown
            changed = True
        if not isinstance(cell.get("source"), str):
            source = cell.get("source")
            cell["source"] = "".join(source) if isinstance(source, list) and all(
                isinstance(line, str) for line in source) else ""
            changed = True
    return changed


def _strip_hidden_everywhere(nb: NotebookNode) -> None:
    """Replace every hidden region by a comment: the kernel must never see a hidden check."""
    for cell in nb.cells:
        while BEGIN_HIDDEN in cell.get("source", ""):
            before, rest = cell.source.split(BEGIN_HIDDEN, 1)
            after = rest.split(END_HIDDEN, 1)[1] if END_HIDDEN in rest else ""
            cell.source = before + HIDDEN_NOTE + after


def annotate(nb: NotebookNode, verdicts: list[Verdict], events: list[str]) -> None:
    """Put each exercise's result under its test cell, for the feedback page."""
    by_cell = {f"test-{v.name}": v for v in verdicts}
    seen = set()
    for cell in nb.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in by_cell and grade_id not in seen and cell.cell_type == "code":
            seen.add(grade_id)
            cell.outputs.append(new_output("stream", name="stdout",
                                           text=f"[grader] {by_cell[grade_id].summary()}\n"))
    if events and nb.cells:
        first = next((c for c in nb.cells if c.cell_type == "code"), None)
        if first is not None:
            first.outputs.append(new_output("stream", name="stdout", text="".join(
                f"[grader] {event}\n" for event in events)))


@dataclass
class Prepared:
    """A submission ready to run: sanitized by nbgrader, flagged, hidden tests removed, with
    the student's own draw (the variants and drawn inputs they are graded on)."""

    student_id: str
    notebook: NotebookNode
    reasons: list[str]
    flags: list[str]
    draw: Draw | None = None
    drawn: list[str] = field(default_factory=list)  # its numbers were not its student's: why
    worked: dict[str, tuple[str | None, int]] = field(default_factory=dict)  # whose numbers
    plan: tuple[Exercise, ...] = ()  # the exercises as this student is graded on them

    def env(self) -> dict[str, str]:
        return self.draw.environment() if self.draw is not None else {}


def recorded_variants(nb: NotebookNode) -> list[tuple[str, str | None, int, str]]:
    """(exercise, student, index, key's fingerprint) of each variant the handed-in notebook
    shows it drew (the saved output of its variant cells; the student may have cleared it, or
    written it)."""
    found = []
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            mark = output.get("metadata", {}).get("counting_the_cost", {}) \
                if isinstance(output, dict) and isinstance(output.get("metadata"), dict) else {}
            shown = mark.get("variant") if isinstance(mark, dict) else None
            if isinstance(shown, dict) and isinstance(shown.get("exercise"), str) \
                    and type(shown.get("index")) is int and 0 <= shown["index"] < 1000 \
                    and (shown.get("student") is None or isinstance(shown.get("student"), str)):
                course = shown.get("course")
                found.append((shown["exercise"][:200], shown["student"], shown["index"],
                              course[:40] if isinstance(course, str) else ""))
    return found[:50]


def worked_on(nb: NotebookNode, lesson: Lesson, draw: Draw | None,
              ) -> dict[str, tuple[str | None, int]]:
    """Exercise -> (whose, variant) of the numbers a handed-in notebook records it was worked
    on, where they are not its student's (the first such record)."""
    found: dict[str, tuple[str | None, int]] = {}
    if draw is None or draw.student is None:
        return found
    for exercise, student, index, _ in recorded_variants(nb):
        name = exercise.removeprefix(f"{lesson.name}/")
        if name in draw.variants and index != draw.variants[name]:
            found.setdefault(name, (student, index))
    return found


def worked_note(lesson: Lesson, exercise: str, whose: tuple[str | None, int],
                verdict: Verdict) -> str:
    """For review: the answer of the numbers a notebook was worked on, and whether the
    student's number was in that answer's band (as the graded check counts it)."""
    from grader.content.notebook_checks import _same_float, readable
    from grader.content.variants import variants_of
    from grader.grading.plans import variant_answer

    student, index = whose
    spec = variants_of(lesson).get(exercise)
    try:
        answer = float(variant_answer(lesson, exercise, index))
    except Exception:  # a variant this version of the lesson no longer has
        return ""
    check = next((c for e in plan_for(lesson, None) if e.name == exercise
                  for c in e.checks if c.rel_tol), None)
    numbers = spec.said(index) if spec and index < len(spec.choices) else f"variant {index}"
    text = (f"worked on the numbers of {inert(student, 60)!r}" if student else
            "worked on the default numbers") + f" ({numbers}), whose answer is {readable(answer)}"
    if verdict.answered is None or check is None:
        return text + "; no number of the student's was read"
    inside = _same_float(verdict.answered, answer, check.rel_tol, 0.0)
    return text + (f"; the student's number, {readable(verdict.answered)}, is "
                   + ("inside" if inside else "outside") + " that answer's band")


def drawn_elsewhere(nb: NotebookNode, lesson: Lesson, draw: Draw | None) -> list[str]:
    """Why a handed-in notebook was worked for other numbers than its student's: drawn for
    another id, on the default numbers (no id), with another course's key, or for this id as
    another variant than the course draws (a code of someone else's, or the lesson's variants
    changed since). It is graded against the student's own numbers either way; the
    instructor is told, in one reason per exercise at most (a notebook cannot bury the
    grader's other reasons under records of its own making)."""
    if draw is None or draw.student is None:
        return []
    found: dict[str, dict[str, list[str]]] = {}  # exercise -> kind of reason -> ids
    for exercise, student, index, course in recorded_variants(nb):
        name = exercise.removeprefix(f"{lesson.name}/")
        if name not in draw.variants:
            continue
        student = student if student is None else canonical(student)
        if student is not None and student != draw.student and student in draw.group:
            if index == draw.variants[name]:
                continue  # a partner who drew the same numbers
            kind = "group member"
        elif student is not None and student != draw.student:  # a copy, whatever its numbers
            kind = "other id"
        elif index == draw.variants[name]:
            continue  # the student's own numbers
        elif student is None:
            kind = "default"
        elif course != draw.course:
            kind = "other key"
        else:
            kind = "other variant"
        found.setdefault(name, {}).setdefault(kind, []).append(student or "")
    reasons = []
    for name, kinds in found.items():
        if "other id" in kinds:
            ids = list(dict.fromkeys(kinds["other id"]))
            more = f" (and {len(ids) - 1} more)" if len(ids) > 1 else ""
            why = f"drawn for another student id, {inert(ids[0], limit=60)!r}{more}"
        elif "group member" in kinds:
            why = (f"worked on the numbers of group member {inert(kinds['group member'][0], 60)!r}"
                   f", not of {inert(draw.student, 60)!r}, whose numbers the group's notebook "
                   "records most")
        elif "default" in kinds:
            why = "worked on the course's default numbers (no student id set in the lab)"
        elif "other key" in kinds:
            why = ("drawn for this student with another course's key (a lab with a course "
                   "directory of its own, without the code from `variants`?)")
        else:
            why = ("drawn for this student as another variant than the course draws (someone "
                   "else's code, or the lesson's variants changed since)")
        reasons.append(f"its {name} was {why}: graded against this student's own numbers")
    return reasons


def source_notebook(lesson: Lesson) -> NotebookNode:
    """The lesson's own notebook, which ``scan`` compares each submission with: read once per
    version of its file, not once per submission (a class of thousands read and validated it
    thousands of times). Shared by every submission: read it, never change it."""
    stat = lesson.notebook.stat()
    return _read_source(lesson.notebook, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _read_source(path: Path, mtime_ns: int, size: int) -> NotebookNode:
    return nbformat.read(path, as_version=4)


def prepare_submission(notebook_path: Path, note: str, lesson: Lesson, student_id: str,
                       db_url: str, gradebook_lock: AbstractContextManager | None = None,
                       draw: Draw | None = None) -> Prepared | Graded:
    """Read and sanitize a submission; a ``Graded`` (invalid) when it cannot be."""
    try:
        submitted = nbformat.read(notebook_path, as_version=4)
    except Exception as error:  # any parse failure makes the submission unreadable
        return Graded(student_id, "invalid", [f"{notebook_path.name} is not a readable "
                                              f"notebook ({type(error).__name__})"])
    source = source_notebook(lesson)
    reasons = [note] if note else []

    def clean() -> tuple[NotebookNode, list[str]]:
        with gradebook_lock or nullcontext():  # nbgrader's preprocessors read the gradebook
            return sanitize(submitted, lesson, student_id, db_url)

    try:
        cleaned, notes = retrying(clean, is_transient=is_database_error,
                                  what=f"the gradebook's database ({database_name(db_url)})")
    except Unavailable:
        raise
    except Exception as error:
        return Graded(student_id, "invalid", [f"the notebook could not be prepared for "
                                              f"grading ({type(error).__name__}: {error})"[:300]])
    return Prepared(student_id, cleaned, reasons + notes, scan(submitted, source), draw,
                    drawn=drawn_elsewhere(submitted, lesson, draw),
                    plan=plan_for(lesson, draw), worked=worked_on(submitted, lesson, draw))


def finish(prepared: Prepared, run: Run, lesson: Lesson) -> Graded:
    """The graded submission from its run: verdicts under the test cells, status and reasons."""
    verdicts = [run.verdicts[exercise.name] for exercise in prepared.plan]
    for verdict in verdicts:
        if verdict.name in prepared.worked:
            verdict.worked = worked_note(lesson, verdict.name, prepared.worked[verdict.name],
                                         verdict)
    annotate(run.notebook, verdicts, run.events)
    reasons = prepared.reasons + run.events
    reasons += [f"code reaches for {what}" for what in prepared.flags]
    reasons += prepared.drawn  # last: the grader's own reasons come first
    status = "needs_review" if reasons else "graded"
    return Graded(prepared.student_id, status, reasons, verdicts, run.notebook, run.seconds,
                  prepared.flags)


def not_graded(prepared: Prepared, why: str) -> Graded:
    """A prepared submission that could not be run or judged: needs_review, saying why."""
    return Graded(prepared.student_id, "needs_review", [*prepared.reasons, why[:500],
                                                        *prepared.drawn], flags=prepared.flags)


def run_prepared(prepared: Prepared, lesson: Lesson, limits: Limits, use_sandbox: bool,
                 partial: bool = False) -> Graded:
    """Run a prepared submission here, judging as it goes."""
    files = [lesson.folder / name for name in lesson.data_files]
    try:
        run = run_submission(prepared.notebook, files, prepared.plan, limits,
                             use_sandbox, partial, env=prepared.env())
    except GradingError as error:
        return not_graded(prepared, f"grading error: {error}")
    return finish(prepared, run, lesson)


def grade_submission(notebook_path: Path, note: str, lesson: Lesson, student_id: str,
                     db_url: str, limits: Limits, use_sandbox: bool,
                     gradebook_lock: AbstractContextManager | None = None,
                     partial: bool = False, draw: Draw | None = None) -> Graded:
    """Everything about one submission except writing the results down."""
    prepared = prepare_submission(notebook_path, note, lesson, student_id, db_url,
                                  gradebook_lock, draw)
    if isinstance(prepared, Graded):
        return prepared
    return run_prepared(prepared, lesson, limits, use_sandbox, partial)
