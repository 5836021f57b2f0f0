"""``python -m grader feedback``: a page per graded student, and the pages as their LMS takes
them back.

nbgrader's ``generate_feedback`` writes each page to ``feedback/STUDENT/LESSON/``, with the
course's template and preprocessors (grader/outputs/preprocessors.py, configured in the course's
nbgrader_config.py). A page shows the grades as they were when it was made, so it must never
outlive them:

- every page of the lesson is withdrawn before the pages are made again, so that a student
  whose new grades cannot be shown (their latest hand-in was invalid, or their page cannot be
  rendered) is left with no page and a line saying why, never with the page of earlier grades;
- only pages that show the grades as they are now are handed out (``current_pages``: the
  LMS zips here, the exchange in grader/outputs/publish.py). Each page records the digest of
  the grades it was made from (grader/gradebook/digest.py: the ledger's row, nbgrader's
  grades, the review log, the submission time, the deadlines file), taken before it is
  rendered, in ``made-from.json`` beside it; it is current while the grades' digest now is
  the same. No clock is compared: a review decided while the page renders makes it stale,
  and a clock that steps back makes nothing stale.
"""

from __future__ import annotations

import json
import re
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from grader.common.errors import CourseError
from grader.common.files import remove_tree, write_text, written
from grader.common.machine import usable_cores
from grader.common.text import inert, tail
from grader.content.lessons import Lesson
from grader.gradebook.digest import grade_digests
from grader.gradebook.store import MADE_FROM, ZIPS_MADE_FROM, withdraw

# The line of nbgrader's log that says why a page could not be made: a Python exception's.
EXCEPTION_LINE = re.compile(r"^\s*(?:\[[^\]]*\]\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Exit)"
                            r"(?::.*)?)$")


FEW = 4  # pages to make, with others kept, that are made one nbgrader run each
# Pages are made by one nbgrader process per core, each making at least this many: a process's
# start (its imports, the lesson's template) costs what some 60 pages of lesson 01 do.
PAGES_A_PROCESS = 60


def write_pages(course, lesson: Lesson, zips: bool = False, remake: bool = False) -> Path:
    """nbgrader's feedback page for every graded student of ``lesson`` whose grades changed
    since their page was made (every page with ``remake``); a page of grades that changed is
    withdrawn first, one of the grades as they are is kept (a class of thousands is not made
    again for the few a review changed). One page that cannot be made does not stop the
    others: it is tried again on its own, and named with the reason if it still fails. With
    ``zips``, also the pages as the students' LMS takes them back, in feedback-zips/LESSON/."""
    folder = course.root / "feedback"
    made_from = grade_digests(course, lesson.name)  # before rendering: a change after shows
    kept = set() if remake else {
        s for s, digest in made_from.items()
        if digest and made_from_page(course, lesson, s) == digest}
    having = {p.parent.parent.name for p in folder.glob(f"*/{lesson.name}/*.html")}
    withdrawn = withdraw(course, lesson, None if not kept else having - kept)
    # a few pages: nbgrader once for each (below); more: in shares, leaving the kept ones out
    few = bool(kept) and len(set(made_from) - kept) <= FEW
    graded = _graded(course, lesson)
    done = None if few else generate(course, lesson, graded,
                                     [s for s in graded if s not in kept])
    graded = _graded(course, lesson)  # again: a page made meanwhile is recorded, or said missing
    to_make = [s for s in graded if s not in kept]
    missing = [s for s in to_make if not page_of(course, lesson, s).exists()]
    nothing_made = bool(to_make) and len(missing) == len(to_make)
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
                              + inert(tail(done or ""), 3000))
    for student in to_make:
        if student not in failed and page_of(course, lesson, student).exists():
            write_text(page_of(course, lesson, student).with_name(MADE_FROM),
                       json.dumps({"grades": made_from.get(student, "")}))
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
    course.log(f"feedback pages in {folder}/<student_id>/{lesson.name}/: "
               f"{len(to_make) - len(failed)} made"
               + (f", {len(kept)} kept (their grades are as they were when their page was "
                  "made; --all makes every page again)" if kept else ""))
    if zips:
        for_lms(course, lesson, current_pages(course, lesson))
    return folder


def generate(course, lesson: Lesson, graded: list[str], to_make: list[str]) -> str:
    """nbgrader's ``generate_feedback`` of ``lesson`` for the students of ``to_make``, the
    others of ``graded`` left out: in one process for each core this one may use (at most one
    for every PAGES_A_PROCESS pages), each making its share. Returns what they logged."""
    processes = max(1, min(usable_cores(), len(to_make) // PAGES_A_PROCESS))
    shares = [to_make[start::processes] for start in range(processes)]
    others = set(graded)

    def make(share: list[str]) -> str:
        done = course.nbgrader("generate_feedback", lesson.name, "--force",
                               exclude=others - set(share))
        return done.stderr + done.stdout

    if processes > 1:  # minutes, not seconds: say so before they pass
        course.log(f"making {len(to_make):,} feedback pages in {processes} processes at once "
                   "(10,000 of lesson 01 took 3.5 minutes on 2 cores)")
    with ThreadPoolExecutor(processes) as pool:  # each thread waits on its nbgrader process
        return "".join(pool.map(make, shares))


def page_of(course, lesson: Lesson, student: str) -> Path:
    return course.root / "feedback" / student / lesson.name / f"{lesson.notebook_id}.html"


def current_pages(course, lesson: Lesson) -> list[Path]:
    """The feedback pages of ``lesson`` that show the grades as they are: a page whose grades
    changed since it was made (its ``made-from.json`` differs from the grades' digest now, or
    it has none) is withdrawn (removed, and said), never handed out."""
    now = grade_digests(course, lesson.name)
    fresh, stale = [], []
    for page in sorted((course.root / "feedback").glob(f"*/{lesson.name}/*.html")):
        student = page.parent.parent.name
        digest = made_from(page)
        if digest and digest == now.get(student):
            fresh.append(page)
        else:
            page.unlink()
            page.with_name(MADE_FROM).unlink(missing_ok=True)
            stale.append(student)
    if stale:
        course.log(f"withdrew {len(stale)} feedback page(s) whose grades changed since they "
                   f"were made (run `python -m grader feedback {lesson.name}` to make them "
                   "again): " + inert(", ".join(stale), 300))
    return fresh


def made_from_page(course, lesson: Lesson, student: str) -> str:
    """The digest of the grades ``student``'s page of ``lesson`` was made from ('' where there
    is no page, or it does not say)."""
    page = page_of(course, lesson, student)
    return made_from(page) if page.exists() else ""


def made_from(page: Path) -> str:
    """The digest of the grades ``page`` was made from ('' where it does not say)."""
    try:
        with page.with_name(MADE_FROM).open("rb") as handle:  # ours, and small
            found = json.loads(handle.read(4096)).get("grades", "")
    except (OSError, ValueError, AttributeError):
        return ""
    return found if isinstance(found, str) else ""


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
    holds: dict[str, list[str]] = {}  # zip -> the students whose pages it holds
    for page in pages:
        student = page.parent.parent.name
        handin = records.get(student, {}).get("handin") or {}
        source, named = handin.get("from"), str(handin.get("download_name", ""))
        if source in ("moodle", "canvas") and not _safe_component(named):
            skipped.append(student)
        elif source == "moodle":
            moodle.append((f"{named}_assignfeedback_file_/{page.name}", page))
            holds.setdefault("moodle-feedback.zip", []).append(student)
        elif source == "canvas":
            canvas.append((student, page, handin))
            holds.setdefault("canvas-reupload.zip", []).append(student)
        else:
            with written(target / f"{student}.zip", "wb") as handle, \
                    zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_DEFLATED) as archive:
                archive.write(page, f"{student}/{lesson.name}/{page.name}")
            holds[f"{student}.zip"] = [student]
            single += 1
    # Which zip holds whose page: a page withdrawn later takes its zips with it
    # (grader/gradebook/store.py, ``withdraw``).
    write_text(target / ZIPS_MADE_FROM, json.dumps(holds, sort_keys=True))
    if moodle:
        with written(target / "moodle-feedback.zip", "wb") as handle, \
                zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_DEFLATED) as archive:
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


