"""Publishing to nbgrader's exchange: the student version released for the Assignment List's
Fetch, and each student's feedback page under their own submission's secret for Fetch
Feedback (never a page older than its grades). Collecting from the exchange is
grader/intake/exchange.py's."""

from __future__ import annotations

import os
import stat
from collections import Counter
from pathlib import Path

from grader.common.errors import CourseError
from grader.common.text import inert, tail
from grader.content.lessons import Lesson
from grader.intake.exchange import (
    SECRET,
    STAMP,
    Exchange,
    check_folders,
    read_small,
    secret_of,
    write_private,
)


def publish(course, lesson: Lesson, exchange: Exchange) -> Path:
    """Copy the released student version to the exchange's outbound folder (nbgrader's
    ``release_assignment``); students' Assignment Lists offer it from then on."""
    if os.path.lexists(exchange.course_path):
        check_folders(course, exchange)
    done = course.nbgrader("release_assignment", lesson.name, "--force", *exchange.options())
    outbound = exchange.course_path / "outbound" / lesson.name
    if done.returncode != 0 or not outbound.is_dir():
        raise CourseError(f"nbgrader release_assignment {lesson.name} to {exchange.root} "
                          "failed (the exchange must be a folder you may write, mode 1777 "
                          "so that students may submit; nbgrader creates it where it may):\n"
                          + inert(tail(done.stderr + done.stdout), 3000))
    _make_sticky(course, exchange.root)
    check_folders(course, exchange, "outbound", "inbound")
    course.log(f"published {lesson.name} to the exchange: {outbound} (course id "
               f"{exchange.course_id}); students fetch it in their Assignment List")
    return outbound


def _make_sticky(course, root: Path) -> None:
    """nbgrader makes the exchange's root mode 0777, where any user may rename the course's
    folder and put their own in its place; with the sticky bit (1777, as /tmp) only its owner
    may. nbgrader compares only the 0777 bits, so it leaves the sticky bit alone."""
    info = root.stat()
    if info.st_mode & stat.S_ISVTX:
        return
    try:
        root.chmod(stat.S_IMODE(info.st_mode) | stat.S_ISVTX)
    except OSError:
        course.log(f"warning: the exchange {root} is not sticky and you may not make it so: "
                   f"its owner should run  chmod 1777 {root}  (otherwise a student can put a "
                   "folder of their own in place of the course's)")


def release_feedback(course, lesson: Lesson, exchange: Exchange) -> int:
    """Put each graded student's feedback page where their Assignment List's Fetch Feedback
    finds it (nbgrader's ``release_feedback``: the page named by a hash of the submission's
    secret). Students graded from elsewhere than the exchange have no secret and are left out.
    Returns how many pages were released."""
    if not os.path.lexists(exchange.course_path):
        raise CourseError(f"no course folder {exchange.course_path} in the exchange: give the "
                          "exchange the lesson was published to (--exchange DIR, --course-id "
                          f"ID), or publish it (python -m grader release {lesson.name} "
                          "--exchange DIR)")
    check_folders(course, exchange, *(["feedback"] if os.path.lexists(
        exchange.course_path / "feedback") else []))
    feedback = course.root / "feedback"
    pages = [p for p in course.current_feedback(lesson)  # none whose grades changed since
             if p.name == f"{lesson.notebook.stem}.html"]
    withdrawn = _withdraw_released(course, lesson, exchange, {p.parent.parent.name
                                                              for p in pages})
    secrets: dict[str, tuple[str, str]] = {}
    without = []
    for page in pages:
        student = page.parent.parent.name
        submitted = course.root / "submitted" / student / lesson.name
        secret = secret_of(read_small(submitted / SECRET, 1024))
        stamp = read_small(submitted / STAMP, 200)
        if not secret or stamp is None:
            without.append(student)
        else:
            secrets[student] = (secret, stamp)
    # Two hand-ins with one secret would get one feedback file: a copied submission. Neither
    # is released (the other student would read the page, or lose their own).
    count = Counter(secret for secret, _ in secrets.values())
    shared = sorted(s for s, (secret, _) in secrets.items() if count[secret] > 1)
    released = []
    for student, (secret, stamp) in secrets.items():
        if student not in shared:
            folder = feedback / student / lesson.name
            write_private(folder / SECRET, secret)
            (folder / STAMP).write_text(stamp)
            released.append(student)
    if released:
        exclude = [p.name for p in feedback.iterdir() if p.name not in set(released)]
        done = course.nbgrader("release_feedback", lesson.name, *exchange.options(),
                               exclude=exclude)
        if done.returncode != 0:
            raise CourseError(f"nbgrader release_feedback {lesson.name} failed:\n"
                              + inert(tail(done.stderr + done.stdout), 3000))
    if withdrawn:
        course.log(f"withdrew from the exchange the feedback released earlier to "
                   f"{len(withdrawn)} student(s) whose grades changed and who have no page "
                   f"now: {inert(', '.join(withdrawn), 200)}")
    course.log(f"released the feedback of {len(released)} student(s) to "
               f"{exchange.course_path / 'feedback'}: they see it with Fetch Feedback in the "
               "Assignment List"
               + (f"; {len(without)} graded from elsewhere than the exchange have no "
                  f"submission secret and were left out: {inert(', '.join(without), 200)}"
                  if without else "")
               + (f"; not released, since their hand-ins carry one and the same secret (a "
                  f"copied submission folder: look at them): {inert(', '.join(shared), 200)}"
                  if shared else ""))
    return len(released)


def _withdraw_released(course, lesson: Lesson, exchange: Exchange,
                       current: set[str]) -> list[str]:
    """Remove from the exchange the page released earlier to each student who has no current
    page (their grades changed, and no page shows the new ones: grader/outputs/feedback.py), so that
    their Fetch Feedback cannot fetch a page older than their grades. The secret that named
    it was kept beside the withdrawn page for this."""
    from nbgrader.utils import notebook_hash

    withdrawn = []
    for kept in sorted((course.root / "feedback").glob(f"*/{lesson.name}/{SECRET}")):
        student = kept.parent.parent.name
        if student in current:
            continue
        secret = secret_of(read_small(kept, 1024))
        released = exchange.course_path / "feedback" / (
            f"{notebook_hash(secret=secret, notebook_id=lesson.notebook.stem)}.html") \
            if secret else None
        if released is not None and released.is_file():
            released.unlink()
            withdrawn.append(student)
        for name in (SECRET, STAMP):
            (kept.parent / name).unlink(missing_ok=True)
    return withdrawn
