"""``python -m grader withdraw LESSON [STUDENT ...] --reason TEXT``: a batch's grades removed,
for a batch that should not have been graded (another lesson's download, the wrong students).

In one transaction of the gradebook's database: nbgrader's submissions of the lesson (their
grades and comments), the grader's status rows, the submission times, and a row per student
in the review log (``withdraw``, with the reason, who and when), which also ends the review
decisions in force (as ``--discard-overrides`` does: they were made on the grades withdrawn).
Then the files made from those grades: the notebooks as stored and as run (``submitted/``,
``autograded/``), the feedback pages and the LMS feedback zips that hold them. The log keeps
every earlier decision; grading the students again starts afresh."""

from __future__ import annotations

import contextlib

from grader.common.errors import CourseError
from grader.common.faults import Unavailable, describe, disk_full
from grader.common.files import remove_tree
from grader.common.text import inert, valid_student_id
from grader.content.lessons import Lesson
from grader.gradebook import ledger
from grader.gradebook import times as stored_times
from grader.gradebook.decisions import who
from grader.gradebook.lock import lesson_lock
from grader.gradebook.store import withdraw as withdraw_pages

MAX_REASON_CHARS = 2000


def withdraw(course, lesson: Lesson, students: list[str], reason: str,
             by: str | None) -> list[str]:
    """Remove the grades of ``lesson`` of ``students`` (all its students where none is
    named), with ``reason`` logged as ``by``'s; returns the students withdrawn."""
    course.writable("withdraw")
    reason = inert(" ".join((reason or "").split()), MAX_REASON_CHARS * 2)
    if not reason:
        raise CourseError("--reason TEXT: say why (the review log keeps it)")
    if len(reason) > MAX_REASON_CHARS:
        raise CourseError(f"--reason is {len(reason)} characters long: at most "
                          f"{MAX_REASON_CHARS}")
    name = who(by)
    with lesson_lock(course, lesson.name, "withdraw"):
        known = _graded(course, lesson)
        unknown = [s for s in students if s not in known]
        if unknown:
            raise CourseError(f"no grades of {lesson.name} to withdraw for "
                              + inert(", ".join(unknown[:10]), 300)
                              + (f"; graded: {inert(', '.join(sorted(known)[:10]), 300)}"
                                 + (" ..." if len(known) > 10 else "") if known
                                 else "; nobody is graded"))
        chosen = sorted(set(students) if students else known)
        if not chosen:
            raise CourseError(f"no grades of {lesson.name} to withdraw: nobody is graded")
        records = course.statuses(lesson.name).get(lesson.name, {})
        held = lms_still_holding(course, lesson.name, {
            student: _ids_of(student, records.get(student) or {}) for student in chosen})
        try:
            _remove(course, lesson, chosen, reason, name)
        except Exception as error:
            if not disk_full(error):
                raise
            raise Unavailable(f"the disk holding {course.root} is full; nothing was withdrawn "
                              "(the transaction was rolled back)", describe(error)) from None
    for student in chosen:
        if valid_student_id(student):
            for folder in ("submitted", "autograded"):
                path = course.root / folder / student / lesson.name
                if path.is_dir() and not path.is_symlink():
                    remove_tree(path)
    withdraw_pages(course, lesson, set(chosen))
    course.record_statuses(lesson, {})
    course.log(f"{lesson.name}: withdrew the grades of {len(chosen)} student(s), as {name} "
               f"({inert(reason, 300)}): {inert(', '.join(chosen), 1000)}. The review log "
               "keeps who, when and why; grading them again starts afresh")
    for file, whose in held.items():
        course.log(f"  the LMS may still hold the grades you imported from {file.name} for "
                   f"{inert(', '.join(whose), 600)}: clear them there (the next export "
                   "rewrites that file, or removes it where no grade of the lesson is left)")
    return chosen


def _ids_of(student: str, record: dict) -> set[str]:
    """Every id an LMS file may name ``student`` by: the gradebook's, the LMS's, the course
    id, the e-mail (case-folded)."""
    handin = record.get("handin") or {}
    found = {student, *(str(handin.get(k) or "") for k in ("lms_id", "course_id", "email"))}
    return {x.casefold() for x in found if x}


def lms_still_holding(course, lesson: str, ids: dict[str, set[str]]) -> dict:
    """The LMS import files of ``lesson`` in the course directory (``export --format canvas``
    or ``moodle``, by default there) that hold a grade of one of the students of ``ids``:
    file -> those students. What such a file gave the LMS stays there until cleared."""
    import csv

    found: dict = {}
    for file in sorted(course.root.glob(f"*-{lesson}.csv")):
        if file.is_symlink() or not file.is_file():
            continue
        try:
            with file.open(newline="", encoding="utf-8-sig") as handle:
                # every column but the last, the score (a score may read as an id)
                cells = {cell.strip().casefold() for row in csv.reader(handle)
                         for cell in row[:-1]}
        except (OSError, UnicodeDecodeError, csv.Error):
            continue
        whose = [student for student, own in ids.items() if own & cells]
        if whose:
            found[file] = whose
    return found


def _graded(course, lesson: Lesson) -> set[str]:
    """The students with grades of ``lesson``: in the ledger or in nbgrader's gradebook."""
    from nbgrader.api import MissingEntry

    found = set(course.statuses(lesson.name).get(lesson.name, {}))
    if course.has_gradebook():
        with course.gradebook() as gb, contextlib.suppress(MissingEntry):
            found |= {s.student.id for s in gb.find_assignment(lesson.name).submissions}
    return found


def _remove(course, lesson: Lesson, students: list[str], reason: str, by: str) -> None:
    """The grades, statuses, times and the log's rows, in one transaction."""
    from nbgrader.api import MissingEntry

    ledger.engine(course.db_url)  # the course's tables exist before the transaction
    stored_times.TIMES.create(ledger.engine(course.db_url), checkfirst=True)
    with course.gradebook() as gb:
        for student in students:
            try:
                submission = gb.find_submission(lesson.name, student)
            except MissingEntry:
                submission = None
            if submission is not None:
                for notebook in submission.notebooks:
                    for row in [*notebook.grades, *notebook.comments]:
                        gb.db.delete(row)
                    gb.db.delete(notebook)
                gb.db.delete(submission)
            for table in (ledger.STATUS, stored_times.TIMES):
                gb.db.execute(table.delete().where((table.c.lesson == lesson.name)
                                                   & (table.c.student_id == student)))
        ledger.log_in(gb.db, [{"lesson": lesson.name, "student_id": student,
                               "action": "withdraw", "by": by, "note": reason}
                              for student in students])
        gb.db.commit()
