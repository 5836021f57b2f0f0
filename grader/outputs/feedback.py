"""``python -m grader feedback``: a page per graded student, and the pages as their LMS takes
them back.

nbgrader's ``generate_feedback`` writes each page to ``feedback/STUDENT/LESSON/``, with the
course's template and preprocessors (grader/outputs/preprocessors.py, configured in the course's
nbgrader_config.py). A page shows the grades as they were when it was made, so it must never
outlive them:

- every page of the lesson is withdrawn before the pages are made again, so that a student
  whose new grades cannot be shown (their latest hand-in was invalid, or their page cannot be
  rendered) is left with no page and a line saying why, never with the page of earlier grades;
- only pages made after their student's grades last changed are handed out
  (``current_pages``: the LMS zips here, the exchange in grader/intake/exchange.py). Grades change
  when a submission is graded (the ledger's ``graded_at``), when review decides (the review
  log), when a submission time is stored, and for everyone when the deadlines file changes.
"""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path

from grader.common.errors import CourseError
from grader.common.files import remove_tree
from grader.common.text import inert, tail
from grader.content.lessons import Lesson
from grader.gradebook.store import withdraw

# The line of nbgrader's log that says why a page could not be made: a Python exception's.
EXCEPTION_LINE = re.compile(r"^\s*(?:\[[^\]]*\]\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Exit)"
                            r"(?::.*)?)$")


def write_pages(course, lesson: Lesson, zips: bool = False) -> Path:
    """nbgrader's feedback page for every graded student of ``lesson``. One page that cannot be
    made does not stop the others: it is tried again on its own, and named with the reason if
    it still fails. With ``zips``, also the pages as the students' LMS takes them back, in
    feedback-zips/LESSON/."""
    folder = course.root / "feedback"
    withdrawn = withdraw(course, lesson)
    done = course.nbgrader("generate_feedback", lesson.name, "--force")
    graded = _graded(course, lesson)
    missing = [s for s in graded if not page_of(course, lesson, s).exists()]
    nothing_made = bool(graded) and len(missing) == len(graded)
    failed: dict[str, str] = {}
    for number, student in enumerate(missing, 1):
        again = course.nbgrader("generate_feedback", lesson.name, "--student", student,
                                "--force")
        if not page_of(course, lesson, student).exists():
            failed[student] = cause(again.stderr + again.stdout) or "nbgrader said nothing"
        if nothing_made and len(failed) == number and number in (3, len(missing)):
            # no page at all, and none of the first few alone: the same error for everyone
            raise CourseError(f"nbgrader generate_feedback {lesson.name} made no page; the "
                              f"first error: {failed[missing[0]]}\n"
                              + inert(tail(done.stderr + done.stdout), 3000))
    for student, why in failed.items():
        course.log(f"no feedback page for {inert(student, 120)}: {why} (run `nbgrader "
                   f"generate_feedback {lesson.name} --student {inert(student, 120)}` in "
                   f"{course.root} for the whole error)")
    gone = sorted(withdrawn - set(graded))
    if gone:
        records = course.statuses(lesson.name).get(lesson.name, {})
        for student in gone:
            record = records.get(student, {})
            course.log(f"withdrew the feedback page of {inert(student, 120)}: their grades "
                       "changed and their latest hand-in has no graded notebook to show ("
                       + inert(f"{record.get('status', 'not graded')}: "
                               f"{record.get('reason', '')}".rstrip(": "), 300) + ")")
    course.log(f"feedback pages in {folder}/<student_id>/{lesson.name}/")
    if zips:
        for_lms(course, lesson, current_pages(course, lesson))
    return folder


def page_of(course, lesson: Lesson, student: str) -> Path:
    return course.root / "feedback" / student / lesson.name / f"{lesson.notebook_id}.html"


def current_pages(course, lesson: Lesson) -> list[Path]:
    """The feedback pages of ``lesson`` that show the grades as they are: a page older than its
    student's grades is withdrawn (removed, and said), never handed out."""
    changed = grades_changed(course, lesson.name)
    fresh, stale = [], []
    for page in sorted((course.root / "feedback").glob(f"*/{lesson.name}/*.html")):
        student = page.parent.parent.name
        if page.stat().st_mtime < changed.get(student, 0.0):
            page.unlink()
            stale.append(student)
        else:
            fresh.append(page)
    if stale:
        course.log(f"withdrew {len(stale)} feedback page(s) older than their grades (run "
                   f"`python -m grader feedback {lesson.name}` to make them again): "
                   + inert(", ".join(stale), 300))
    return fresh


def grades_changed(course, lesson_name: str) -> dict[str, float]:
    """student -> when their grades of ``lesson_name`` last changed, in seconds since the
    epoch: the latest of their grading (the ledger), review decision (the review log),
    stored submission time (``ctc_submission_time``, grader/intake/times.py), and the
    deadlines file's last change. The times are the writing machines' clocks: graders that
    share a database keep theirs in step (NTP)."""
    from sqlalchemy import column, func, inspect, select, table

    from grader.gradebook import ledger

    if not course.has_gradebook():
        return {}
    try:
        everyone = os.stat(course.deadlines_file).st_mtime
    except OSError:
        everyone = 0.0
    engine = ledger.engine(course.db_url)
    queries = [
        select(ledger.STATUS.c.student_id, ledger.STATUS.c.graded_at)
        .where(ledger.STATUS.c.lesson == lesson_name),
        select(ledger.REVIEW_LOG.c.student_id, func.max(ledger.REVIEW_LOG.c.at))
        .where(ledger.REVIEW_LOG.c.lesson == lesson_name)
        .group_by(ledger.REVIEW_LOG.c.student_id),
    ]
    if inspect(engine).has_table("ctc_submission_time"):
        times = table("ctc_submission_time", column("lesson"), column("student_id"),
                      column("recorded_at"))
        queries.append(select(times.c.student_id, times.c.recorded_at)
                       .where(times.c.lesson == lesson_name))
    found: dict[str, float] = {}
    with engine.connect() as connection:
        for query in queries:
            for student, when in connection.execute(query):
                found[student] = max(found.get(student, everyone), float(when or 0.0))
    return found


def cause(log: str) -> str:
    """Why nbgrader made no page, in one line: the last exception its log names."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        match = EXCEPTION_LINE.match(line)
        if match:
            return inert(match[1], 300)
    return inert(lines[-1], 300) if lines else ""


def _graded(course, lesson: Lesson) -> list[str]:
    """The students with a graded notebook of ``lesson`` (autograded/STUDENT/LESSON/)."""
    autograded = course.root / "autograded"
    if not autograded.is_dir():
        return []
    return sorted(p.name for p in autograded.iterdir() if (p / lesson.name).is_dir())


def for_lms(course, lesson: Lesson, pages: list[Path]) -> None:
    """The feedback pages as each student's LMS takes them back, in feedback-zips/LESSON/:

    - Moodle ("Upload multiple feedback files in a zip", mod/assign/feedback/file/
      importziplib.php): one zip, a folder per student named
      ``<Full Name>_<participant id>_assignfeedback_file_`` as the download named them.
    - Canvas ("Re-Upload Submissions"): one zip, each page named as the download named the
      file it answers (grader/outputs/lms_export.py, ``canvas_reupload_zip``).
    - Others: one zip per student, ``<student_id>.zip``.
    """
    target = course.root / "feedback-zips" / lesson.name
    if target.exists():
        remove_tree(target)
    target.mkdir(parents=True)
    records = course.statuses(lesson.name).get(lesson.name, {})
    moodle, canvas, single, skipped = [], [], 0, []
    for page in pages:
        student = page.parent.parent.name
        handin = records.get(student, {}).get("handin") or {}
        source, named = handin.get("from"), str(handin.get("download_name", ""))
        if source in ("moodle", "canvas") and not _safe_component(named):
            skipped.append(student)
        elif source == "moodle":
            moodle.append((f"{named}_assignfeedback_file_/{page.name}", page))
        elif source == "canvas":
            canvas.append((student, page, handin))
        else:
            with zipfile.ZipFile(target / f"{student}.zip", "w",
                                 compression=zipfile.ZIP_DEFLATED) as archive:
                archive.write(page, f"{student}/{lesson.name}/{page.name}")
            single += 1
    if moodle:
        with zipfile.ZipFile(target / "moodle-feedback.zip", "w",
                             compression=zipfile.ZIP_DEFLATED) as archive:
            for member, page in moodle:
                archive.write(page, member)
        course.log(f"{len(moodle)} page(s) in {target}/moodle-feedback.zip: in the Moodle "
                   "assignment, View all submissions > Grading action > Upload multiple "
                   "feedback files in a zip")
    if canvas:
        from grader.outputs.lms_export import canvas_reupload_zip

        left = canvas_reupload_zip(target / "canvas-reupload.zip", canvas)
        course.log(f"{len(canvas) - len(left)} page(s) in {target}/canvas-reupload.zip: on the "
                   "Canvas assignment's page, Re-Upload Submissions (each page becomes a comment"
                   " on the student's submission)" + "".join(f"\n  left out {why}"
                                                            for why in left))
    if single:
        course.log(f"{single} zip(s) in {target}/, one per student")
    if skipped:
        course.log(f"no LMS folder for {len(skipped)} student(s) whose download name cannot "
                   "be a file name: " + inert(", ".join(skipped), 300))


def _safe_component(name: str) -> bool:
    """Whether a name the download gave can name a folder here and in a zip: one path
    component, valid UTF-8, nothing a terminal would run."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return (0 < len(name.encode()) <= 200 and name not in (".", "..") and "/" not in name
            and "\\" not in name and inert(name, 1000) == name)


