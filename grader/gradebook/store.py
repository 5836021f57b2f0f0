"""Storing one graded submission as one unit: its grades, the review decisions in force, its
status, reason, details and notebook hash, in one transaction of the gradebook's database; the
notebook as run, for feedback; and the withdrawal of a feedback page older than the grades."""

from __future__ import annotations

import nbformat

from grader.common.faults import (
    Unavailable,
    database_name,
    describe,
    is_database_error,
    is_disk_error,
    retrying,
)
from grader.common.files import remove_tree
from grader.common.text import (
    gradebook_text,
    inert,
    shown_safely,
    text_safe,
    valid_student_id,
)
from grader.content.lessons import Lesson
from grader.gradebook import ledger
from grader.grading.autograde import Graded


def store_submission(course, lesson: Lesson, graded: Graded,
           review: tuple[bool, str | None] = (False, None)) -> Graded:
    """Store one submission as one unit: its grades (every earlier grade of it replaced),
    the review decisions in force applied again (or, with ``review[0]``, discarded, which
    the review log records), its status, reason, details and the hash of the notebook
    graded, all in one transaction of the gradebook's database. A database that does not
    answer is waited for, then ``Unavailable`` stops the batch: a submission is stored
    whole or not at all, and --resume trusts what was stored. A submission whose grades
    cannot be stored for a reason of its own is stored with no points, flagged."""
    from grader.gradebook.decisions import state_of

    database = f"the gradebook's database ({database_name(course.db_url)})"

    def transient(error: BaseException) -> bool:
        from nbgrader.api import InvalidEntry

        # InvalidEntry: another grader added the same student at the same instant
        return is_database_error(error) or isinstance(error, InvalidEntry)

    if not valid_student_id(graded.student_id):  # no gradebook row: the ledger alone
        row = ledger_row(course, lesson, graded)
        retrying(lambda: ledger.write(course.db_url, lesson.name, [row]),
                 what=database, is_transient=is_database_error, log=course.log)
        return graded
    state = retrying(lambda: state_of(course.db_url, lesson.name, graded.student_id),
                     what=database, is_transient=is_database_error, log=course.log)
    write_autograded(course, lesson, graded)
    try:
        retrying(lambda: commit(course, lesson, graded, state, review[0], review[1]),
                 what=database, is_transient=transient, log=course.log)
    except Unavailable:
        raise
    except Exception as error:  # this submission's own data: flag it, with no points
        graded.status = "needs_review"
        graded.reasons.append(f"its grades could not be saved ({type(error).__name__}: "
                              f"{error})"[:300])
        graded.notebook, graded.verdicts = None, []
        write_autograded(course, lesson, graded)
        retrying(lambda: commit(course, lesson, graded, state, review[0], review[1]),
                 what=database, is_transient=transient, log=course.log)
    # A feedback page shows grades: one made before these is withdrawn now, so that
    # nothing (nbgrader's release_feedback, an LMS zip) hands out the old grades.
    withdraw(course, lesson, {graded.student_id})
    if state.in_force:
        who = inert(graded.student_id, 120)
        if review[0]:
            course.log(f"  {who}: review decisions discarded (--discard-overrides)")
        else:
            older = {d.notebook_sha256 for d in state.in_force} - {
                graded.notebook_sha256, ""}
            course.log(f"  {who}: kept review decisions ({state.summary()})"
                       + ("; they were made on another notebook than this one"
                          if older and graded.notebook_sha256 else "")
                       + "; --discard-overrides drops them")
    return graded


def write_autograded(course, lesson: Lesson, graded: Graded) -> None:
    """The notebook as run, for feedback, in autograded/STUDENT/LESSON/ (written before
    the grades are committed: a kill in between leaves a newer notebook and the older
    grades, which --resume grades again). A full disk stops the batch."""
    autograded = course.root / "autograded" / graded.student_id / lesson.name
    try:
        if autograded.exists():
            remove_tree(autograded)
        if graded.notebook is None:
            return
        autograded.mkdir(parents=True)
        staged = autograded / f".{lesson.notebook.name}.partial"
        nbformat.write(nbformat.from_dict(text_safe(shown_safely(graded.notebook))), staged)
        staged.replace(autograded / lesson.notebook.name)
    except OSError as error:
        if is_disk_error(error):
            raise Unavailable(f"the disk holding {course.root} cannot be written",
                              describe(error)) from error
        raise


def commit(course, lesson: Lesson, graded: Graded, state, discard: bool,
            by: str | None) -> None:
    """One transaction: the student's grades, the review decisions in force (nbgrader's
    ``manual_score``), the ledger's row; and, when discarding decisions, the log's row."""
    from nbgrader.api import Grade
    from sqlalchemy.orm import joinedload, undefer

    from grader.gradebook.decisions import who

    ledger.engine(course.db_url)  # the course's own tables exist before the transaction
    points = {f"test-{v.name}": v.points for v in graded.verdicts} \
        if graded.notebook is not None else {}
    overrides = state.overrides if state.in_force and not discard else {}
    with course.gradebook() as gb:
        # nbgrader commits these two itself; neither changes a grade of an existing row
        gb.update_or_create_student(graded.student_id, **student_fields(course,
            lesson, graded.student_id, gb=gb))
        submission = gb.update_or_create_submission(lesson.name, graded.student_id)
        for notebook in submission.notebooks:
            # The notebook's grades with their cells (the name) and max_score in one query:
            # read grade by grade, each asked the database for its cell and its max_score
            # (nbgrader defers it), and each of those queries flushed the grade before it
            grades = gb.db.query(Grade).filter(Grade.notebook_id == notebook.id).options(
                undefer(Grade.max_score), joinedload(Grade.cell)).all()
            for grade in grades:
                grade.auto_score = min(points.get(grade.name, 0), grade.max_score)
                decision = overrides.get(grade.name.removeprefix("test-"))
                grade.manual_score = None if decision is None else min(
                    float(decision.points), float(grade.max_score))
                grade.needs_manual_grade = False
        ledger.write_in(gb.db, lesson.name, [ledger_row(course, lesson, graded)])
        if discard and state.in_force:
            ledger.log_in(gb.db, [{"lesson": lesson.name, "student_id": graded.student_id,
                                   "action": "discard", "by": who(by), "note": "",
                                   "notebook_sha256": graded.notebook_sha256}])
        gb.db.commit()


def ledger_row(course, lesson: Lesson, graded: Graded) -> dict:
    """The ledger's row of a graded submission: status, reason, hash, details."""
    details = {} if graded.notebook is None else {
        "seconds": round(graded.seconds, 2),
        "flags": graded.flags,
        "exercises": {v.name: {"points": v.points, "max_points": v.max_points,
                               "passed": v.passed, "total": v.total, "note": v.note,
                               "failures": v.visible_failures[:10],
                               "hidden_failed": v.hidden_failed,
                               "hidden_failures": v.hidden_failures[:10],
                               "first_run": v.first_run[:10], "told": v.told,
                               **({"worked": v.worked} if v.worked else {})}
                      for v in graded.verdicts}}
    details["checks"] = course.checks_version(lesson)  # what made it (gradebook/checks.py)
    handin = course.handins.get(lesson.name, {}).get(graded.student_id)
    if handin:
        details["handin"] = handin
    if graded.drawn_for is not None:
        details["drawn_for"] = graded.drawn_for
    if graded.drawn_with is not None:
        details["drawn_with"] = graded.drawn_with
    return {"student_id": graded.student_id, "status": graded.status,
            "reason": graded.reason, "notebook_sha256": graded.notebook_sha256,
            "details": details}


def student_fields(course, lesson: Lesson, student_id: str, gb=None) -> dict[str, str]:
    """What nbgrader's Student row keeps of a hand-in, for formgrader and ``nbgrader
    export``: the name, the e-mail and the LMS's own id. A name or e-mail the row has
    already (the roster: ``nbgrader db student import``, formgrader, an earlier hand-in)
    wins over the download's, which the student may have typed (Gradescope's ``:name:``,
    Blackboard's ``Name:``). Whatever the row keeps is written neutral
    (``gradebook_text``). ``gb``: the open gradebook to read the row from (else one is
    opened)."""
    from nbgrader.api import Student

    def stored(book) -> tuple[str | None, str | None, str | None]:
        row = book.db.query(Student).filter(Student.id == student_id).one_or_none()
        return (row.first_name, row.last_name, row.email) if row else (None, None, None)

    if gb is not None:
        first, last, email = stored(gb)
    else:
        with course.gradebook() as own:
            first, last, email = stored(own)
    record = course.handins.get(lesson.name, {}).get(student_id) or {}
    fields = {"first_name": first, "last_name": last} if first or last else {
        "last_name": record.get("name")}
    fields["email"] = email or record.get("email")
    if record and record.get("from") not in ("folders", "nbgrader"):
        fields["lms_user_id"] = record.get("lms_id") or student_id
    return {key: gradebook_text(value) for key, value in fields.items() if value}


# Beside a feedback page: the digest of the grades it was made from (grader/outputs/feedback.py).
MADE_FROM = "made-from.json"
# In feedback-zips/LESSON/: which zip holds whose page.
ZIPS_MADE_FROM = "made-from.json"


def withdraw(course, lesson: Lesson, students: set[str] | None = None) -> set[str]:
    """Remove the feedback pages of ``lesson`` (of ``students``, else everyone's), and every
    LMS feedback zip that holds one of them (feedback-zips/LESSON/): to be done whenever
    grades change, so that nothing made from the old grades stays to be handed out. Returns
    the students who had a page. What else is in their folders stays (the copy of the
    submission's secret: grader/outputs/publish.py withdraws by it the page released to the
    exchange)."""
    withdrawn = set()
    folder = course.root / "feedback"
    pages = (folder.glob(f"*/{lesson.name}/*.html") if students is None else
             (page for student in students
              for page in (folder / student / lesson.name).glob("*.html")))
    for page in pages:
        page.unlink(missing_ok=True)
        page.with_name(MADE_FROM).unlink(missing_ok=True)
        withdrawn.add(page.parent.parent.name)
    if withdrawn:
        _withdraw_zips(course, lesson, withdrawn if students is not None else None)
    return withdrawn


def _withdraw_zips(course, lesson: Lesson, students: set[str] | None) -> None:
    """The LMS feedback zips of ``lesson`` that hold a page of ``students`` (None: all)."""
    import json

    target = course.root / "feedback-zips" / lesson.name
    if not target.is_dir():
        return
    try:
        holds = json.loads((target / ZIPS_MADE_FROM).read_text())
    except (OSError, ValueError):
        holds = None  # made before zips were recorded: none can be told current
    gone = []
    for archive in sorted(target.glob("*.zip")):
        held = holds.get(archive.name) if isinstance(holds, dict) else None
        if students is None or not isinstance(held, list) or set(held) & students:
            archive.unlink(missing_ok=True)
            gone.append(archive.name)
    if gone and students is not None:  # (all of them: the pages are being made again)
        course.log(f"  withdrew {len(gone)} LMS feedback zip(s) of {lesson.name} that held a "
                   f"page of grades that changed: {inert(', '.join(gone), 300)} (python -m "
                   f"grader feedback {lesson.name} --zip makes them again)")
