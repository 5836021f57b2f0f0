"""The version of a lesson's checks: what a stored grade was computed against.

A grade depends on more than the notebook handed in: on the expected values (the reference
code in ``solutions/``, the hidden cases and each lesson's variants in
``grader/content/cases/``, the data files the lesson reads), on how they are compared
(``grader/content/notebook_checks.py``, and the grader's judging: ``JUDGING``), on how each
student's numbers are drawn (``grader/content/variants.py``) and on the released lesson that
nbgrader restores the locked cells from (``<course-dir>/source/LESSON/``). The version is a
hash of all of these, stored with every grade (the ledger's ``details``, key
``checks``), so that ``autograde --resume`` grades again what other checks graded (a check
fixed mid-term, a ``git pull``), and ``report`` and ``review`` say which checks made each
grade. The key a grade's numbers were drawn with is stored beside it (``drawn_with``): a new
key changes no grade, since each hand-in is graded on the key its notebook records
(grader/gradebook/coursestate.py)."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

from grader.content.lessons import CHECKS_SOURCE, Lesson

VERSION_CHARS = 12  # shown and stored: enough to tell versions apart, short enough to read
# The grader's own code that turns a run into a verdict: the expected values of each student's
# checks (plans), the comparison of a reply with them and the verdict (probe, execute), and
# the cases' tolerances and forms (cases/__init__). A fix there changes grades as a fix of a
# lesson's cases does, so --resume grades again what it graded.
JUDGING = ("grader.grading.plans", "grader.grading.probe", "grader.grading.execute",
           "grader.content.cases")
KEY = "checks"  # the ledger's details key


def _module_file(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    return Path(spec.origin) if spec is not None and spec.origin else None


def checks_version(course, lesson: Lesson) -> str:
    """The version of ``lesson``'s checks in ``course``: the first hex digits of a SHA-256
    over every file that decides an expected value or its comparison (see the module's
    docstring), each named."""
    import grader.content.variants as variants

    digest = hashlib.sha256()
    released = course.root / "source" / lesson.name / lesson.notebook.name
    files = [("notebook", lesson.notebook), ("released", released),
             ("reference", _module_file(lesson.module)), ("cases", _module_file(lesson.cases)),
             ("comparison", CHECKS_SOURCE), ("draws", Path(variants.__file__)),
             *((f"judging/{name}", _module_file(name)) for name in JUDGING),
             *((f"data/{name}", lesson.folder / name) for name in lesson.data_files)]
    for label, path in files:
        try:
            data = path.read_bytes() if path is not None else b""
        except OSError:
            data = b""
        digest.update(f"{label}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()[:VERSION_CHARS]


def version_of(record: dict) -> str:
    """The checks' version a stored grade records ('' for a grade stored before versions)."""
    return str(record.get(KEY) or "")


def describe(version: str, current: str) -> str:
    """A grade's version as ``review`` and ``report`` say it."""
    if not version:
        return "checks of a version not recorded (graded before versions were kept)"
    if version == current:
        return f"checks {version} (the lesson's checks now)"
    return f"checks {version}, not the lesson's now ({current}): --resume grades it again"
