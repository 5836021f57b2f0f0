"""Where the course's files are, and what each lesson consists of."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from grader.common.errors import CourseError

COURSE_ID = "counting-the-cost"  # nbgrader's course id, in the gradebook and the exchange
REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
DATA = REPO / "data"
CHECKS_SOURCE = Path(__file__).resolve().parent / "notebook_checks.py"
LESSON_NAME = re.compile(r"^\d\d_[a-z0-9_]+$")
# nbgrader's markers around the hidden part of a test cell.
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


@dataclass(frozen=True)
class Lesson:
    """One lesson: a folder of notebooks/ holding one nbgrader source notebook.

    The notebook's metadata ``course`` names its reference module (``solutions.floats``), its
    hidden-check cases (``grader.content.cases.floats``) and the files of data/ it ships with.
    """

    name: str
    folder: Path
    notebook: Path
    module: str
    cases: str
    data_files: tuple[str, ...]

    @property
    def notebook_id(self) -> str:
        return self.notebook.stem


def all_lessons() -> list[Lesson]:
    """Every lesson of notebooks/, in course order."""
    return [load_lesson(path.name) for path in sorted(NOTEBOOKS.iterdir())
            if path.is_dir() and LESSON_NAME.match(path.name)]


def load_lesson(name: str) -> Lesson:
    folder = NOTEBOOKS / name
    if not LESSON_NAME.match(name) or not folder.is_dir():
        known = ", ".join(p.name for p in sorted(NOTEBOOKS.iterdir()) if LESSON_NAME.match(p.name))
        raise CourseError(f"no lesson named {name!r}; the lessons are: {known}")
    notebooks = sorted(folder.glob("*.ipynb"))
    if len(notebooks) != 1:
        raise CourseError(f"{folder} must hold exactly one notebook, found {len(notebooks)}")
    meta = nbformat.read(notebooks[0], as_version=4).metadata.get("course", {})
    try:
        return Lesson(name, folder, notebooks[0], meta["module"], meta["cases"],
                      tuple(meta.get("data_files", ())))
    except KeyError as missing:
        raise CourseError(f"{notebooks[0]}: notebook metadata 'course' lacks {missing}") from None


def lesson_names(names: list[str] | None) -> list[Lesson]:
    """The lessons named, or all of them when none is named."""
    return [load_lesson(n) for n in names] if names else all_lessons()
