"""The instructor's course: a course directory (grader/gradebook/coursedir.py) and what can
be done with it, each step in its own module: grading a class (grader/gradebook/batch.py),
reading the grades (grader/gradebook/grades.py), feedback pages (grader/outputs/feedback.py).
The command line (grader/cli/), the lab and the tests use this."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from grader.content.lessons import Lesson
from grader.gradebook import batch
from grader.gradebook import store as storage
from grader.gradebook.coursedir import DEFAULT_COURSE_DIR, CourseDir


class Course(CourseDir):
    """A course directory, and the steps run on it."""

    def autograde(self, lesson: Lesson, submissions: Path, **options) -> dict[str, dict[str, str]]:
        """Grade every student's notebook in ``submissions`` (grader/gradebook/batch.py)."""
        return batch.autograde(self, lesson, submissions, **options)

    def store(self, lesson: Lesson, graded, review: tuple[bool, str | None] = (False, None)):
        """Store one graded submission as one unit (grader/gradebook/store.py)."""
        return storage.store_submission(self, lesson, graded, review)

    def feedback(self, lesson: Lesson, zips: bool = False, remake: bool = False) -> Path:
        """nbgrader's feedback page for every graded student whose grades changed since their
        page was made (grader/outputs/feedback.py; every page with ``remake``), each earlier
        page of changed grades withdrawn first: no page outlives the grades it shows. With
        ``zips``, also the pages as the students' LMS takes them back, in
        feedback-zips/LESSON/."""
        from grader.outputs.feedback import write_pages

        return write_pages(self, lesson, zips, remake)

    def current_feedback(self, lesson: Lesson) -> list[Path]:
        """The feedback pages of ``lesson`` not older than their student's grades: the only
        ones to hand out (a stale one is withdrawn)."""
        from grader.outputs.feedback import current_pages

        return current_pages(self, lesson)


def open_course(course_dir: str | None, log: Callable[[str], None] = print,
                db_url: str | None = None, deadlines: str | None = None) -> Course:
    return Course(Path(course_dir) if course_dir else DEFAULT_COURSE_DIR, log, db_url,
                  Path(deadlines) if deadlines else None)


def hub_variants(root, user: str) -> str:
    """``CTC_VARIANTS`` for a JupyterHub user's server: their numbers in every lesson, drawn
    for their course id (the roster's, where it maps the hub user name; else the name) with
    the course's key, checked against the course's gradebook wherever the course keeps it (the
    database its nbgrader_config.py names). Read only: the hub runs as another user."""
    import ast
    import re
    from pathlib import Path

    from grader.content.variants import kernel_variants, lab_variants
    from grader.gradebook.coursestate import checked_key
    from grader.gradebook.identity import Roster, read_roster

    root = Path(root)
    database = None
    try:
        text = (root / "nbgrader_config.py").read_text()
        found = re.search(r"^c\.CourseDirectory\.db_url = (.+)$", text, re.MULTILINE)
        database = ast.literal_eval(found.group(1)) if found else None
    except (OSError, ValueError, SyntaxError):
        database = None
    if isinstance(database, str) and database.startswith("sqlite:///") and not Path(
            database.removeprefix("sqlite:///")).exists():
        database = None  # no gradebook yet: none is made here
    course = CourseDir(root, log=lambda _: None, database=database, write_config=False)
    key = checked_key(course, create=True, record=False)
    if key is None:
        return kernel_variants(None, {})
    owners, _ = (read_roster(course.db_url) if course.has_gradebook() else Roster()).find(
        "nbgrader", user, "", "")
    return lab_variants(key, next(iter(owners)) if len(owners) == 1 else user)
