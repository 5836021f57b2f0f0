"""A course directory: where the grader keeps its state, and nbgrader's commands run in it.


Everything lives in one course directory (default ``.course/`` in the repository)::

    nbgrader_config.py   written by us on every command
    gradebook.db         nbgrader's gradebook, and the course's own tables
    (grader/gradebook/ledger.py):
                         each submission's status, and the review log
    source/LESSON/       copy of notebooks/LESSON, refreshed by release
    release/LESSON/      student version (solutions and hidden tests stripped)
    submitted/STUDENT/LESSON/  the notebook as handed in (nothing else is copied, but for
                         nbgrader's timestamp.txt and submission_secret.txt from an exchange)
    collected/STUDENT/LESSON/  submissions collected from nbgrader's exchange
    (grader/intake/exchange.py)
    exchange.json        the exchange's folder and course id, as release --exchange was given
    autograded/STUDENT/LESSON/ the notebook as run in the sandbox, with each exercise's result
    feedback/STUDENT/LESSON/   nbgrader's HTML feedback
    grading_status.json  per submission: graded / needs_review / invalid, why, and per exercise
    reports/LESSON/      pass rates, score histogram, flagged submissions
    demo/LESSON/         the instructor version, for running in class
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from grader.common.errors import CourseError
from grader.common.faults import Unavailable, check_space, describe, is_disk_error
from grader.common.files import write_text
from grader.common.text import tail
from grader.content.lessons import COURSE_ID, REPO, Lesson
from grader.content.variants import KEY_FILE as KEY_NAME
from grader.content.variants import variants_of
from grader.gradebook import deadlines as deadlines_mod
from grader.gradebook import ledger
from grader.gradebook.schema import EXCLUDE_FILE

DEFAULT_COURSE_DIR = REPO / ".course"
STATUS_FILE = "grading_status.json"
# The course's templates (grader/outputs/templates/): the feedback page's, and formgrader's
# MathJax-less one (grader.outputs.exporter.inert_formgrader), named in nbgrader's config.
TEMPLATES = Path(__file__).resolve().parents[1] / "outputs" / "templates"

# `python -m nbgrader`, after `import grader` (which spares it a second of jsonschema's start:
# grader/__init__.py), stamping a new gradebook without a second Python
# (grader/gradebook/schema.py).
NBGRADER = ("import runpy, sys, grader.gradebook.schema as schema; schema.patch_nbgrader(); "
            "sys.argv[0] = 'nbgrader'; sys.argv += schema.excluded(); "
            "runpy.run_module('nbgrader', run_name='__main__', alter_sys=True)")

CONFIG_TEMPLATE = """\
# Written by `python -m grader` on every command; edits here are overwritten.
c = get_config()  # noqa: F821
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.db_url = {db_url!r}
c.GenerateFeedback.preprocessors = [
    "grader.outputs.exporter.GetGradesAtOnce",
    "grader.outputs.preprocessors.ShowReview",
    "grader.outputs.preprocessors.ShowLate",
    "grader.outputs.preprocessors.NameExercises",
    "grader.outputs.preprocessors.RedactHiddenTests",
    "grader.outputs.preprocessors.SanitizeUntrusted",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
c.ShowLate.deadlines_file = {deadlines!r}
c.NameExercises.source_root = {source!r}
# The course's feedback template, for feedback pages alone: formgrader renders its grading
# pages with nbgrader's HTMLExporter, which must keep its own template ("formgrade").
c.GenerateFeedback.exporter_class = "grader.outputs.exporter.FeedbackExporter"
c.FeedbackExporter.template_name = "ctc_feedback"  # nbgrader's feedback, a few blocks changed
c.FeedbackExporter.template_file = "ctc.html.j2"
c.FeedbackExporter.extra_template_basedirs = [{templates!r}, {nbgrader_templates!r}]
# formgrader's grading pages are served by the instructor's Jupyter server, where a student's
# script would act with the instructor's session: each submission is made inert there too.
from grader.outputs.exporter import inert_formgrader  # noqa: E402

inert_formgrader(c)
"""


@dataclass
class CourseDir:
    """A course directory and the nbgrader commands run in it: its state (what each hand-in
    said, the gradebook's lock) lives here; what the grader does with it, in the modules of
    grader/gradebook/ and grader/outputs/, which take it as ``course``."""

    root: Path
    log: Callable[[str], None] = print
    database: str | None = None  # a SQLAlchemy URL; None: gradebook.db in the course directory
    deadlines_file: Path | None = None  # None: deadlines.toml in the course directory
    write_config: bool = True  # False: read as another user (the hub), nothing written

    def __post_init__(self) -> None:
        self.handins: dict[str, dict[str, dict]] = {}  # lesson -> student -> Handin.record
        self.queue_key: Path | None = None  # autograde --queue-key; None: <root>/queue.key
        self.gradebook_lock = threading.Lock()  # one reader or writer of the gradebook at once
        self.root = self.root.resolve()
        if self.root.exists() and not self.root.is_dir():
            raise CourseError(f"course directory {self.root} exists and is not a folder")
        self.deadlines_file = (self.deadlines_file.resolve() if self.deadlines_file
                               else self.root / "deadlines.toml")
        self.read_only = ""  # why the course directory cannot be written, where it cannot
        if not self.write_config:  # read as another user (the hub): nothing written
            self.read_only = "it is read here as another user"
            return
        # Solutions, hidden checks, the gradebook and students' work: for this user alone.
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as error:
            raise CourseError(f"cannot make the course directory {self.root}: "
                              f"{error.strerror}") from None
        config = CONFIG_TEMPLATE.format(
            root=str(self.root), course_id=COURSE_ID, db_url=self.db_url,
            deadlines=str(self.deadlines_file), source=str(self.root / "source"),
            templates=str(TEMPLATES), nbgrader_templates=nbgrader_templates())
        path = self.root / "nbgrader_config.py"
        try:
            unchanged = path.read_text() == config
        except OSError:
            unchanged = False
        if not os.access(self.root, os.W_OK):
            self.read_only = "it is read-only"
        elif not unchanged:
            try:
                write_text(path, config)
            except (OSError, Unavailable) as error:  # a snapshot, a share read-only to us
                self.read_only = f"it cannot be written ({error})"

    def writable(self, command: str, elsewhere: str = "") -> None:
        """Stop ``command``, which writes in the course directory, where it cannot be
        written; the read-only commands go on (``export --csv`` elsewhere, ``review LESSON``
        and ``review LESSON STUDENT``, ``variants``, ``report --out`` elsewhere).
        ``elsewhere``: how the command could write outside it."""
        if self.read_only:
            raise CourseError(f"{command} writes in the course directory {self.root}, and "
                              f"{self.read_only}: {elsewhere or 'run it on a writable copy'} "
                              "(what only reads works here: export --csv FILE elsewhere, "
                              "review LESSON [STUDENT], variants, report LESSON --out DIR)")

    def nbgrader(self, *args: str,
                 exclude: Iterable[str] = ()) -> subprocess.CompletedProcess[str]:
        """Run one nbgrader command in the course directory, output captured; the students of
        ``exclude`` left out."""
        return run_nbgrader(self.root, args, exclude)

    def gradebook(self):
        from nbgrader.api import Gradebook

        from grader.gradebook.schema import add_indexes, patch_nbgrader

        patch_nbgrader()
        gb = Gradebook(self.db_url, course_id=COURSE_ID)
        add_indexes(gb.engine)
        return gb

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

    def key(self, create: bool = False, new: int = 0) -> bytes | None:
        """The course's key, checked against the gradebook (grader/gradebook/coursestate.py)."""
        from grader.gradebook.coursestate import checked_key

        return checked_key(self, create=create, new=new)

    def release(self, lesson: Lesson, new_key: int = 0) -> Path:
        """Write the student version of ``lesson`` to ``release/LESSON`` and register it."""
        from grader.content.sync import sync_lesson  # loads torch: only the commands that release

        drift = sync_lesson(lesson, write=False)
        if drift:
            raise CourseError(f"{lesson.name} is out of step: {drift[0]}; "
                              "run `python -m grader sync` first")
        self.writable("release")
        full = f"the disk holding {self.root} is full: {lesson.name} is not released"
        check_space([self.root])
        varies = bool(variants_of(lesson))
        try:
            if varies or new_key:  # each student's own numbers: the course's key, made once
                self.key(create=True, new=new_key)
            source = self.root / "source" / lesson.name
            if source.exists():
                shutil.rmtree(source)
            shutil.copytree(lesson.folder, source,
                            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        except shutil.Error as error:  # copytree's errors, each as text
            if any("No space left" in str(why) or "Disk quota" in str(why)
                   for *_, why in error.args[0]):
                raise Unavailable(full) from None
            raise
        except OSError as error:
            if is_disk_error(error):
                raise Unavailable(full, describe(error)) from None
            raise
        done = self.nbgrader("generate_assignment", lesson.name, "--force")
        if done.returncode != 0:
            if "No space left on device" in done.stderr + done.stdout:
                raise Unavailable(full)
            raise CourseError(f"nbgrader generate_assignment {lesson.name} failed:\n"
                              + tail(done.stderr + done.stdout))
        self.__dict__.pop("_checks_versions", None)  # the released lesson is part of them
        release = self.root / "release" / lesson.name
        if varies:  # the gradebook exists now: its key's fingerprint is recorded with it
            self.key(create=True)
        self.log(f"released {lesson.name}: student version in {release}")
        return release

    def deadlines(self):
        """The deadlines file (grader/gradebook/deadlines.py), or None where there is none; each
        extension
        given to the student of the gradebook it names. Its warnings (a lesson the course does
        not have, an extension that names no one) are said once per command."""
        found = deadlines_mod.load(self.deadlines_file, required=self.deadlines_file
                                   != self.root / "deadlines.toml")
        if found is None:
            return None
        from grader.gradebook.deadlines_check import people

        found.resolve(people(self.db_url) if self.has_gradebook() else {})
        said = self.__dict__.setdefault("_deadline_warnings", set())
        for warning in found.warnings:
            if warning not in said:
                said.add(warning)
                self.log(f"warning: {warning}")
        return found

    def checks_version(self, lesson: Lesson) -> str:
        """The version of ``lesson``'s checks (grader/gradebook/checks.py), computed once per
        command: what every grade this command stores is made with."""
        from grader.gradebook.checks import checks_version

        versions = self.__dict__.setdefault("_checks_versions", {})
        if lesson.name not in versions:
            versions[lesson.name] = checks_version(self, lesson)
        return versions[lesson.name]

    @property
    def db_url(self) -> str:
        return self.database or f"sqlite:///{self.root / 'gradebook.db'}"

    def has_gradebook(self) -> bool:
        return self.database is not None or (self.root / "gradebook.db").exists()

    def record_statuses(self, lesson: Lesson, statuses: dict[str, dict[str, str]]) -> None:
        """Write grading_status.json, a copy of the whole ledger for people and scripts (the
        ledger itself is written submission by submission). Where the database cannot be
        read now, the copy waits for the next command."""
        try:
            copy = json.dumps(self.statuses(), indent=1, sort_keys=True)
        except CourseError:
            return
        with contextlib.suppress(OSError, Unavailable):
            write_text(self.root / STATUS_FILE, copy)

    def grades(self) -> list[dict[str, object]]:
        """One row per student and lesson, decisions and late penalties applied
        (grader/gradebook/grades.py)."""
        from grader.gradebook.grades import grades

        return grades(self)

    def statuses(self, lesson: str | None = None) -> dict[str, dict[str, dict]]:
        """lesson -> student -> status, reason, exercises: from the ledger."""
        if not self.has_gradebook():
            return {}
        try:
            return ledger.read(self.db_url, lesson)
        except Exception as error:
            raise CourseError(f"cannot read the grading ledger in {self.db_url}: "
                              f"{type(error).__name__}: {error}") from None


def nbgrader_templates() -> str:
    """nbgrader's own template folder (its feedback and formgrade templates, which ours
    extend or shadow)."""
    import nbgrader

    return str(Path(nbgrader.__file__).resolve().parent / "server_extensions" / "formgrader"
               / "templates")


def student_codes(course: CourseDir, students: list[str]) -> list[tuple[str, str]]:
    """Each student's code (grader/content/variants.py): ``students``, or every student the
    gradebook knows."""
    from grader.common.text import valid_student_id
    from grader.content.variants import student_code, varying_predictions

    key = course.key()
    if key is None:
        raise CourseError(f"{course.root} has no key ({KEY_NAME}): release a lesson first "
                          "(python -m grader release); a course released before keys existed "
                          "has none until  python -m grader release --new-key")
    if not students:
        from grader.gradebook.identity import course_ids

        students = course_ids(course)
    if not students and course.has_gradebook():
        with course.gradebook() as gb:
            students = sorted(student.id for student in gb.students)
    if not students:
        raise CourseError("no students named, and none in the gradebook: name them "
                          "(python -m grader variants ID ...)")
    bad = [s for s in students if not valid_student_id(s)]
    if bad:
        raise CourseError(f"not student ids: {', '.join(map(repr, bad[:5]))}")
    varying = varying_predictions()  # every lesson's graded predictions, read once for the class
    return [(student, student_code(key, student, varying)) for student in students]


def write_codes(course: CourseDir, codes: list[tuple[str, str]], path: Path) -> None:
    """``variants --csv FILE``: course_id, name, email, code, one row per student, for a mail
    merge (names and e-mails from the course roster; a course id that is an e-mail is its
    own). Written whole; cells a spreadsheet would read as a formula are made text."""
    import csv

    from grader.common.files import written
    from grader.common.text import display, student_cell
    from grader.gradebook.identity import read_roster

    people = read_roster(course.db_url).people if course.has_gradebook() else {}
    with written(path, newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["course_id", "name", "email", "code"])
        for student, code in codes:
            person = people.get(student, {})
            email = person.get("email") or (student if "@" in student else "")
            writer.writerow([student_cell(student), display(person.get("name") or ""),
                             display(email), code])
    course.log(f"wrote {len(codes)} code(s) to {path}: course_id, name, email, code")


def run_nbgrader(root: Path, args: Iterable[str],
                 exclude: Iterable[str] = ()) -> subprocess.CompletedProcess[str]:
    """One nbgrader command run in ``root``, output captured, the students of ``exclude`` left
    out (nbgrader's ``CourseDirectory.student_id_exclude``, passed in a file: thousands of ids
    are longer than one argument may be)."""
    env = dict(os.environ)
    # nbgrader's first gradebook creation runs `alembic`, which lives beside this python.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop(EXCLUDE_FILE, None)  # only ever this call's
    with tempfile.TemporaryDirectory(prefix="ctc-nbgrader-") as folder:
        if exclude:
            env[EXCLUDE_FILE] = os.path.join(folder, "exclude")
            Path(env[EXCLUDE_FILE]).write_text(",".join(sorted(exclude)))
        return subprocess.run([sys.executable, "-c", NBGRADER, *args], cwd=root, env=env,
                              capture_output=True, text=True, check=False)
