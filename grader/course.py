"""The instructor's steps, run on nbgrader's own commands and gradebook.

Everything lives in one course directory (default ``.course/`` in the repository)::

    nbgrader_config.py   written by us on every command
    gradebook.db         nbgrader's gradebook
    source/LESSON/       copy of notebooks/LESSON, refreshed by release
    release/LESSON/      student version (solutions and hidden tests stripped)
    submitted/STUDENT/LESSON/  the notebook as handed in (nothing else is copied)
    autograded/STUDENT/LESSON/ the notebook as run in the sandbox, with each exercise's result
    feedback/STUDENT/LESSON/   nbgrader's HTML feedback
    grading_status.json  per submission: graded / needs_review / invalid, why, and per exercise
    reports/LESSON/      pass rates, score histogram, flagged submissions
    demo/LESSON/         the instructor version, for running in class
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import nbformat

from grader.autograde import Graded, grade_submission
from grader.lessons import REPO, CourseError, Lesson
from grader.sandbox import Limits, bwrap_path
from grader.sync import sync_lesson

COURSE_ID = "counting-the-cost"
DEFAULT_COURSE_DIR = REPO / ".course"
STATUS_FILE = "grading_status.json"
MAX_ZIP_BYTES = 2 * 2**30  # unpacked size of an LMS zip we accept
MAX_NOTEBOOK_BYTES = 50 * 2**20
STUDENT_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._@+-")

CONFIG_TEMPLATE = """\
# Written by `python -m grader` on every command; edits here are overwritten.
c = get_config()  # noqa: F821
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = {course_id!r}
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "grader.preprocessors.RedactHiddenTests",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
"""


@dataclass
class Course:
    """A course directory and the nbgrader commands run in it."""

    root: Path
    log: Callable[[str], None] = print

    def __post_init__(self) -> None:
        self._details: dict[str, dict[str, dict]] = {}
        self._gradebook_lock = threading.Lock()  # one reader or writer of the gradebook at once
        self.root = self.root.resolve()
        if self.root.exists() and not self.root.is_dir():
            raise CourseError(f"course directory {self.root} exists and is not a folder")
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "nbgrader_config.py").write_text(
            CONFIG_TEMPLATE.format(root=str(self.root), course_id=COURSE_ID))

    # ------------------------------------------------------------------ nbgrader

    def nbgrader(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run one nbgrader command in the course directory, output captured."""
        env = dict(os.environ)
        # nbgrader's first gradebook creation runs `alembic`, which lives beside this python.
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        return subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=self.root, env=env,
                              capture_output=True, text=True, check=False)

    def gradebook(self):
        from nbgrader.api import Gradebook

        return Gradebook(f"sqlite:///{self.root / 'gradebook.db'}", course_id=COURSE_ID)

    def is_released(self, lesson: Lesson) -> bool:
        from nbgrader.api import MissingEntry

        if not (self.root / "release" / lesson.name).is_dir():
            return False
        with self.gradebook() as gb:
            try:
                gb.find_assignment(lesson.name)
            except MissingEntry:
                return False
        return True

    # ------------------------------------------------------------------ release

    def release(self, lesson: Lesson) -> Path:
        """Write the student version of ``lesson`` to ``release/LESSON`` and register it."""
        drift = sync_lesson(lesson, write=False)
        if drift:
            raise CourseError(f"{lesson.name} is out of step: {drift[0]}; "
                              "run `python -m grader sync` first")
        source = self.root / "source" / lesson.name
        if source.exists():
            shutil.rmtree(source)
        shutil.copytree(lesson.folder, source,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        done = self.nbgrader("generate_assignment", lesson.name, "--force")
        if done.returncode != 0:
            raise CourseError(f"nbgrader generate_assignment {lesson.name} failed:\n"
                              + _tail(done.stderr + done.stdout))
        release = self.root / "release" / lesson.name
        self.log(f"released {lesson.name}: student version in {release}")
        return release

    # ------------------------------------------------------------------ autograde

    def autograde(self, lesson: Lesson, submissions: Path, jobs: int = 1,
                  use_sandbox: bool = True, limits: Limits | None = None,
                  ) -> dict[str, dict[str, str]]:
        """Grade every student's notebook in ``submissions`` (a folder or a zip of folders)."""
        if not submissions.exists():
            raise CourseError(f"no such submissions folder or zip: {submissions}")
        if use_sandbox and bwrap_path() is None:
            raise CourseError(
                "bubblewrap (bwrap) is not installed, so student code cannot be sandboxed. "
                "Install it (Debian/Ubuntu: apt-get install bubblewrap; it needs Linux), or pass "
                "--no-sandbox to run student code with your own rights (only for code you trust)")
        if not use_sandbox:
            print("warning: --no-sandbox: student code runs with your rights and can read, "
                  "change or delete your files", file=sys.stderr)
        if not self.is_released(lesson):
            self.release(lesson)
        limits = limits or Limits()
        statuses: dict[str, dict[str, str]] = {}
        with _unpacked(submissions, self.root) as folder:
            students = sorted(p for p in folder.iterdir() if p.is_dir())
            if not students:
                raise CourseError(f"{submissions} holds no student folders "
                                  "(expected SUBMISSIONS/<student_id>/<notebook>.ipynb)")
            progress = Progress(len(students), self.log)
            pending = []
            for student_folder in students:
                early = self._receive(lesson, student_folder)
                if isinstance(early, Graded):
                    self._store(lesson, early)
                    statuses[early.student_id] = progress.done(early)
                else:
                    pending.append(early)

            def work(item: tuple[str, Path, str]) -> Graded:
                student_id, notebook, note = item
                try:
                    return grade_submission(notebook, note, lesson, student_id, self.db_url,
                                            limits, use_sandbox, self._gradebook_lock)
                except Exception as error:  # a bug of ours must not stop the batch
                    return Graded(student_id, "needs_review",
                                  [f"grading error: {type(error).__name__}: {error}"[:500]])

            with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                for graded in pool.map(work, pending):
                    with self._gradebook_lock:
                        self._store(lesson, graded)
                    statuses[graded.student_id] = progress.done(graded)
            progress.finish()
        self._record(lesson, statuses)
        return statuses

    @property
    def db_url(self) -> str:
        return f"sqlite:///{self.root / 'gradebook.db'}"

    def _receive(self, lesson: Lesson, folder: Path) -> Graded | tuple[str, Path, str]:
        """Copy a student's notebook (and nothing else) in; what cannot be graded, say why."""
        student_id = folder.name
        if not student_id or student_id.startswith(".") or set(student_id) - STUDENT_ID_CHARS:
            return Graded(student_id, "invalid", ["student id has characters other than "
                                                  "letters, digits and ._@+- (rename the folder)"])
        notebook, note = _find_notebook(folder, lesson)
        target = self.root / "submitted" / student_id / lesson.name
        if target.exists():  # re-grading replaces the earlier submission entirely
            shutil.rmtree(target)
        if notebook is None:
            return Graded(student_id, "invalid", [note])
        target.mkdir(parents=True)
        copy = target / lesson.notebook.name
        shutil.copyfile(notebook, copy)  # only the notebook: nothing can shadow a module
        return student_id, copy, note

    def _store(self, lesson: Lesson, graded: Graded) -> None:
        """Write one submission's grades: every earlier grade of it is replaced."""
        self._zero(lesson, graded.student_id)
        autograded = self.root / "autograded" / graded.student_id / lesson.name
        if autograded.exists():
            shutil.rmtree(autograded)
        if graded.notebook is None:
            return
        points = {f"test-{v.name}": v.points for v in graded.verdicts}
        with self.gradebook() as gb:
            submission = gb.find_submission(lesson.name, graded.student_id)
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    if grade.name in points:
                        grade.auto_score = min(points[grade.name], grade.max_score)
            gb.db.commit()
        autograded.mkdir(parents=True)
        nbformat.write(graded.notebook, autograded / lesson.notebook.name)
        self._details.setdefault(lesson.name, {})[graded.student_id] = {
            "seconds": round(graded.seconds, 2),
            "flags": graded.flags,
            "exercises": {v.name: {"points": v.points, "max_points": v.max_points,
                                   "passed": v.passed, "total": v.total}
                          for v in graded.verdicts},
        }

    def _zero(self, lesson: Lesson, student_id: str) -> None:
        """Record a submission with no gradable notebook: every grade 0."""
        with self.gradebook() as gb:
            gb.update_or_create_student(student_id)
            submission = gb.update_or_create_submission(lesson.name, student_id)
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    grade.auto_score, grade.manual_score = 0, None
                    grade.needs_manual_grade = False
            gb.db.commit()

    def _record(self, lesson: Lesson, statuses: dict[str, dict[str, str]]) -> None:
        path = self.root / STATUS_FILE
        everything = json.loads(path.read_text()) if path.exists() else {}
        details = self._details.get(lesson.name, {})
        everything.setdefault(lesson.name, {}).update(
            {student: {**status, **details.get(student, {})}
             for student, status in statuses.items()})
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(everything, indent=1, sort_keys=True))
        tmp.replace(path)

    # ------------------------------------------------------------------ export

    def grades(self) -> list[dict[str, object]]:
        """One row per student and lesson: scores from the gradebook, status from our ledger."""
        path = self.root / STATUS_FILE
        statuses = json.loads(path.read_text()) if path.exists() else {}
        if not (self.root / "gradebook.db").exists():
            return []
        rows = []
        with self.gradebook() as gb:
            for assignment in sorted(gb.assignments, key=lambda a: a.name):
                for submission in sorted(assignment.submissions, key=lambda s: s.student.id):
                    status = statuses.get(assignment.name, {}).get(submission.student.id, {})
                    max_score = float(assignment.max_score)
                    score = min(max(float(submission.score), 0.0), max_score)
                    rows.append({
                        "student_id": submission.student.id,
                        "lesson": assignment.name,
                        "score": score,
                        "max_score": max_score,
                        "status": status.get("status", "graded"),
                        "reason": status.get("reason", ""),
                    })
        return rows

    def export(self, csv_path: Path) -> int:
        rows = self.grades()
        csv_path.parent.mkdir(parents=True, exist_ok=True)
        with csv_path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, ["student_id", "lesson", "score", "max_score",
                                             "status", "reason"], quoting=csv.QUOTE_NONNUMERIC)
            writer.writeheader()
            for row in rows:
                writer.writerow({k: _spreadsheet_safe(v) for k, v in row.items()})
        self.log(f"wrote {len(rows)} row(s) to {csv_path}")
        return len(rows)

    # ------------------------------------------------------------------ feedback

    def feedback(self, lesson: Lesson) -> Path:
        done = self.nbgrader("generate_feedback", lesson.name, "--force")
        if done.returncode != 0:
            raise CourseError(f"nbgrader generate_feedback {lesson.name} failed:\n"
                              + _tail(done.stderr + done.stdout))
        folder = self.root / "feedback"
        self.log(f"feedback pages in {folder}/<student_id>/{lesson.name}/")
        return folder


class Progress:
    """Submissions done, failed and remaining: one line each, or a live line on a terminal."""

    def __init__(self, total: int, log: Callable[[str], None]):
        self.total, self.log = total, log
        self.counts = {"graded": 0, "needs_review": 0, "invalid": 0}
        self.live = sys.stderr.isatty()

    def done(self, graded: Graded) -> dict[str, str]:
        self.counts[graded.status] += 1
        finished = sum(self.counts.values())
        line = (f"[{finished}/{self.total}] {graded.student_id}: {graded.status}"
                + (f" ({graded.reason})" if graded.reason else ""))
        self.log(line)
        if self.live:
            bar = "#" * (30 * finished // self.total)
            print(f"\r[{bar:<30}] {finished}/{self.total} done, "
                  f"{self.counts['needs_review'] + self.counts['invalid']} flagged or failed, "
                  f"{self.total - finished} remaining", end="", file=sys.stderr, flush=True)
        return {"status": graded.status, "reason": graded.reason}

    def finish(self) -> None:
        if self.live:
            print(file=sys.stderr)


def _spreadsheet_safe(value: object) -> object:
    """Keep a spreadsheet from running a cell as a formula (=, +, -, @ at the start)."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def _find_notebook(folder: Path, lesson: Lesson) -> tuple[Path | None, str]:
    """The student's notebook for ``lesson``, and a note when it had to be guessed."""
    expected = folder / lesson.notebook.name
    if expected.is_file() and not expected.is_symlink():
        if expected.stat().st_size > MAX_NOTEBOOK_BYTES:
            return None, f"{expected.name} is larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB"
        return expected, ""
    found = [p for p in folder.rglob("*.ipynb")
             if p.is_file() and not p.is_symlink() and ".ipynb_checkpoints" not in p.parts]
    if len(found) == 1 and found[0].stat().st_size <= MAX_NOTEBOOK_BYTES:
        return found[0], f"graded {found[0].relative_to(folder)} in place of {expected.name}"
    if not found:
        return None, f"no notebook {expected.name} in the submission"
    return None, f"no {expected.name}, and {len(found)} other notebooks: cannot tell which"


@contextmanager
def _unpacked(submissions: Path, course_root: Path) -> Iterator[Path]:
    """The submissions as a folder of student folders; a zip is unpacked safely first."""
    if submissions.is_dir():
        yield submissions
        return
    if not zipfile.is_zipfile(submissions):
        raise CourseError(f"{submissions} is neither a folder nor a zip file")
    with tempfile.TemporaryDirectory(dir=course_root, prefix="unzip-") as tmp:
        root = Path(tmp)
        with zipfile.ZipFile(submissions) as archive:
            members = archive.infolist()
            if sum(m.file_size for m in members) > MAX_ZIP_BYTES:
                raise CourseError(f"{submissions} unpacks to more than "
                                  f"{MAX_ZIP_BYTES // 2**30} GiB; refusing")
            for member in members:
                target = (root / member.filename).resolve()
                is_link = (member.external_attr >> 16) & 0o170000 == 0o120000
                if root.resolve() not in target.parents or is_link:
                    raise CourseError(f"{submissions}: member {member.filename!r} is a link or "
                                      "points outside the archive; refusing the whole zip")
            archive.extractall(root)
        entries = [p for p in root.iterdir() if not p.name.startswith(("__MACOSX", "."))]
        # A zip of one folder that holds the student folders: step into it.
        if len(entries) == 1 and entries[0].is_dir() and not any(entries[0].glob("*.ipynb")):
            root = entries[0]
        yield root


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def open_course(course_dir: str | None, log: Callable[[str], None] = print) -> Course:
    return Course(Path(course_dir) if course_dir else DEFAULT_COURSE_DIR, log)
