"""``python -m grader progress``: which exercises of the student's own copies pass their checks.

Each lesson of the workspace runs top to bottom in a kernel of its own, as Validate runs it (the
demos shrink), and each exercise's test cell is read: passes, fails (with the one line that says
why) or not done yet. The student's files are read, never written.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from grader.lab_validate import HIDDEN_NOTE, summarize
from grader.lessons import Lesson


def execute(nb: nbformat.NotebookNode, folder: Path, mode: str | None, timeout: int,
            **options) -> None:
    """Run ``nb`` top to bottom in a fresh kernel working in ``folder``, its outputs kept in
    ``nb``. NBGRADER_EXECUTION is ``mode`` meanwhile, as nbgrader sets it ("validate",
    "autograde": the lessons' demos then do less work), or unset for None. ``options`` go to
    nbclient's ``NotebookClient``."""
    previous = os.environ.pop("NBGRADER_EXECUTION", None)
    if mode is not None:
        os.environ["NBGRADER_EXECUTION"] = mode
    try:
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": str(folder)}}, **options).execute()
    finally:
        os.environ.pop("NBGRADER_EXECUTION", None)
        if previous is not None:
            os.environ["NBGRADER_EXECUTION"] = previous


def lesson_progress(notebook: Path, timeout: int = 120) -> str:
    """The summary of one notebook, run in a copy in memory."""
    nb = nbformat.read(notebook, as_version=4)
    execute(nb, notebook.parent, "validate", timeout, allow_errors=True,  # as under Validate
            iopub_timeout=30, raise_on_iopub_timeout=False)
    _, summary = summarize(nb)
    return summary.replace("\n\n" + HIDDEN_NOTE, "")


def progress(workspace: Path, lessons: list[Lesson], log=print) -> int:
    """Print each lesson's progress; exit status 0 (it reports, it does not judge)."""
    for lesson in lessons:
        notebook = workspace / lesson.name / lesson.notebook.name
        log(f"{lesson.name}:")
        if not notebook.exists():
            log("  not started: `make lab` makes your copy\n")
            continue
        log("  " + lesson_progress(notebook).replace("\n", "\n  ") + "\n")
    log(HIDDEN_NOTE)
    return 0
