"""What a student's grades of a lesson are, as one hash: the digest a feedback page is made
from, compared later to tell whether the page still shows the grades.

Wall clocks cannot tell it: a review decided while a page is being rendered is older than
the page and yet not on it, and a clock that steps back makes every page look older than its
grades. So a page records the digest of what it was made from (computed before it is
rendered), and is current while the digest of the grades now is the same. The digest covers
everything a page shows: the grader's row (status, reasons, each exercise's result, the
notebook's hash, the checks' version, when it was stored), nbgrader's grades (the grader's
score and any score a person set, formgrader included), the review log's rows, the stored
submission time, and the deadlines file's bytes."""

from __future__ import annotations

import hashlib
import json

from grader.gradebook import ledger
from grader.gradebook import times as stored_times


def grade_digests(course, lesson: str) -> dict[str, str]:
    """student -> the digest of their grades of ``lesson`` now (every student with a row in
    the ledger, nbgrader's gradebook, the review log or the submission times)."""
    from sqlalchemy import select

    if not course.has_gradebook():
        return {}
    parts: dict[str, list] = {}
    engine = ledger.engine(course.db_url)
    stored_times.TIMES.create(engine, checkfirst=True)
    status, log, times = ledger.STATUS, ledger.REVIEW_LOG, stored_times.TIMES
    with engine.connect() as connection:
        for row in connection.execute(select(status).where(status.c.lesson == lesson)):
            parts.setdefault(row.student_id, []).append(
                ["ledger", row.status, row.reason, row.details, row.notebook_sha256,
                 repr(row.graded_at)])
        for row in connection.execute(select(log).where(log.c.lesson == lesson)
                                      .order_by(log.c.id)):
            parts.setdefault(row.student_id, []).append(
                ["log", row.id, row.action, row.exercise, repr(row.points), row.note, row.by,
                 repr(row.at)])
        for row in connection.execute(select(times).where(times.c.lesson == lesson)):
            parts.setdefault(row.student_id, []).append(
                ["time", repr(row.submitted_at), row.source, bool(row.late_mark),
                 repr(row.recorded_at)])
    for student, grades in _grades(course, lesson).items():
        parts.setdefault(student, []).append(["grades", *grades])
    try:
        deadlines = hashlib.sha256(course.deadlines_file.read_bytes()).hexdigest()
    except OSError:
        deadlines = ""
    return {student: hashlib.sha256(json.dumps([deadlines, *found], sort_keys=True,
                                               default=str).encode()).hexdigest()
            for student, found in parts.items()}


def _grades(course, lesson: str) -> dict[str, list]:
    """student -> each grade of their submission of ``lesson`` in nbgrader's gradebook: its
    cell, the grader's score, a person's score and extra credit."""
    from nbgrader.api import (
        Assignment,
        Grade,
        GradeCell,
        SubmittedAssignment,
        SubmittedNotebook,
    )

    found: dict[str, list] = {}
    with course.gradebook() as gb:
        query = (gb.db.query(SubmittedAssignment.student_id, GradeCell.name, Grade.auto_score,
                             Grade.manual_score, Grade.extra_credit)
                 .select_from(Grade)
                 .join(SubmittedNotebook, Grade.notebook_id == SubmittedNotebook.id)
                 .join(SubmittedAssignment,
                       SubmittedNotebook.assignment_id == SubmittedAssignment.id)
                 .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id)
                 .join(GradeCell, Grade.cell_id == GradeCell.id)
                 .filter(Assignment.name == lesson))
        for student, cell, auto, manual, extra in query:
            found.setdefault(student, []).append([cell, repr(auto), repr(manual), repr(extra)])
    return {student: sorted(grades) for student, grades in found.items()}
