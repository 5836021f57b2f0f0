"""Whose numbers a student's saved notebook was worked on, and what to re-run when they are not
the student's own.

A lesson's variant cell records, in its saved output, the student id and variant it drew
(grader/content/notebook_checks.py's ``your_variant``); grading flags a notebook whose record
is not its student's and grades it on the student's own numbers (grader/grading/autograde.py).
Validate, ``progress`` and the lab's start read the same record and say so before the hand-in,
in one line that names what to re-run. The student's draws come from the lab's
``CTC_VARIANTS`` (grader/content/variants.py), never from the course's key.
"""

from __future__ import annotations

import json

from nbformat import NotebookNode

from grader.content.notebook_checks import SET_YOUR_ID
from grader.grading.autograde import recorded_variants


def lab_draws(value: str | None) -> tuple[str | None, dict[str, int]]:
    """(student id, {"LESSON/EXERCISE": variant}) of a ``CTC_VARIANTS`` value; (None, {})
    for none, or one that is not the lab's."""
    try:
        given = json.loads(value or "{}")
        student, draws = given.get("student"), given.get("draws", {})
    except (ValueError, AttributeError):
        return None, {}
    if not isinstance(student, str) or not isinstance(draws, dict):
        return None, {}
    return student, {k: v for k, v in draws.items() if isinstance(k, str) and type(v) is int}


def saved_numbers_problem(nb: NotebookNode, variants: str | None) -> str:
    """One line when the saved ``nb`` was worked on other numbers than the ones ``variants``
    (the lab's ``CTC_VARIANTS``) gives this student, saying what to re-run; "" when they agree
    or the notebook records none (its variant cell never ran, or was cleared)."""
    student, draws = lab_draws(variants)
    for exercise, worked_for, index, _course in recorded_variants(nb):
        if student is None:
            if worked_for is None:
                continue  # no id then, none now: the defaults, for self-study
            return (f"This notebook was worked on the numbers drawn for {worked_for!r:.60}, but "
                    f"this lab has no student id set, and runs it on the course's default "
                    f"numbers. {SET_YOUR_ID}")
        if exercise not in draws or (worked_for == student and index == draws[exercise]):
            continue
        elif worked_for is None:
            why = (f"its numbers are the course's default ones (it was worked without a student "
                   f"id), not the ones drawn for {student}")
        elif worked_for != student:
            why = f"its numbers were drawn for another id, {worked_for!r:.60}, not for {student}"
        else:
            why = (f"its numbers were drawn for {student} with another course key or code than "
                   "this lab's")
        return (f"This notebook was worked on other numbers than yours: {why}. Run the cell "
                "that prints \"Your numbers\" again, then redo your graded prediction for the "
                "numbers it shows and save: grading asks about yours.")
    return ""
