"""The instructor's steps, run on nbgrader's own commands and gradebook.

Everything lives in one course directory (default ``.course/`` in the repository)::

    nbgrader_config.py   written by us on every command
    gradebook.db         nbgrader's gradebook, and the course's own tables (grader/ledger.py):
                         each submission's status, and the review log
    source/LESSON/       copy of notebooks/LESSON, refreshed by release
    release/LESSON/      student version (solutions and hidden tests stripped)
    submitted/STUDENT/LESSON/  the notebook as handed in (nothing else is copied, but for
                         nbgrader's timestamp.txt and submission_secret.txt from an exchange)
    collected/STUDENT/LESSON/  submissions collected from nbgrader's exchange (grader/exchange.py)
    exchange.json        the exchange's folder and course id, as release --exchange was given
    autograded/STUDENT/LESSON/ the notebook as run in the sandbox, with each exercise's result
    feedback/STUDENT/LESSON/   nbgrader's HTML feedback
    grading_status.json  per submission: graded / needs_review / invalid, why, and per exercise
    reports/LESSON/      pass rates, score histogram, flagged submissions
    demo/LESSON/         the instructor version, for running in class
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError, ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import nbformat

from grader import deadlines as deadlines_mod
from grader import ledger
from grader.autograde import Graded, grade_submission
from grader.faults import (
    Unavailable,
    check_space,
    database_name,
    describe,
    is_database_error,
    is_disk_error,
    process_alive,
    retrying,
)
from grader.feedback import withdraw
from grader.handins import LABELS, Handin, named_by_lms, recognise
from grader.intake import (
    Received,
    copy_notebook,
    display_name,
    inert,
    text_safe,
    unpack_zip,
    valid_student_id,
)
from grader.lessons import REPO, CourseError, Lesson
from grader.processes import Cgroup
from grader.sandbox import Limits, bwrap_path, remove_tree
from grader.sync import sync_lesson

COURSE_ID = "counting-the-cost"
DEFAULT_COURSE_DIR = REPO / ".course"
STATUS_FILE = "grading_status.json"

CONFIG_TEMPLATE = """\
# Written by `python -m grader` on every command; edits here are overwritten.
c = get_config()  # noqa: F821
c.CourseDirectory.root = {root!r}
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.db_url = {db_url!r}
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "grader.preprocessors.ShowReview",
    "grader.preprocessors.ShowLate",
    "grader.preprocessors.NameExercises",
    "grader.preprocessors.RedactHiddenTests",
    "grader.preprocessors.SanitizeUntrusted",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
c.ShowLate.deadlines_file = {deadlines!r}
c.NameExercises.source_root = {source!r}
# The course's feedback template, for feedback pages alone: formgrader renders its grading
# pages with nbgrader's HTMLExporter, which must keep its own template ("formgrade").
c.GenerateFeedback.exporter_class = "grader.preprocessors.FeedbackExporter"
c.FeedbackExporter.template_name = "ctc_feedback"  # nbgrader's feedback, a few blocks changed
c.FeedbackExporter.template_file = "ctc.html.j2"
c.FeedbackExporter.extra_template_basedirs = [{templates!r}, {nbgrader_templates!r}]
"""


@dataclass
class Course:
    """A course directory and the nbgrader commands run in it."""

    root: Path
    log: Callable[[str], None] = print
    database: str | None = None  # a SQLAlchemy URL; None: gradebook.db in the course directory
    deadlines_file: Path | None = None  # None: deadlines.toml in the course directory

    def __post_init__(self) -> None:
        self._handins: dict[str, dict[str, dict]] = {}  # lesson -> student -> Handin.record
        self._gradebook_lock = threading.Lock()  # one reader or writer of the gradebook at once
        self.root = self.root.resolve()
        if self.root.exists() and not self.root.is_dir():
            raise CourseError(f"course directory {self.root} exists and is not a folder")
        # Solutions, hidden checks, the gradebook and students' work: for this user alone.
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.deadlines_file = (self.deadlines_file.resolve() if self.deadlines_file
                               else self.root / "deadlines.toml")
        (self.root / "nbgrader_config.py").write_text(CONFIG_TEMPLATE.format(
            root=str(self.root), course_id=COURSE_ID, db_url=self.db_url,
            deadlines=str(self.deadlines_file), source=str(self.root / "source"),
            templates=str(Path(__file__).resolve().parent / "templates"),
            nbgrader_templates=_nbgrader_templates()))

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

        return Gradebook(self.db_url, course_id=COURSE_ID)

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
                  partial: bool = False, resume: bool = False, broker: str | None = None,
                  layout: str | None = None, keep_handins: bool = False,
                  discard_overrides: bool = False, by: str | None = None,
                  times: Path | None = None) -> dict[str, dict[str, str]]:
        """Grade every student's notebook in ``submissions``: a folder or a zip, in the
        grader's own layout or as an LMS delivers it (``layout``: see grader/handins.py;
        recognised from the files when None). ``keep_handins``: what an earlier download said
        of each hand-in (name, late mark, layout) stands (a regrade of stored notebooks).
        The review decisions in force for a student are kept and applied to the new grades,
        unless ``discard_overrides`` (logged as ``by``'s decision). Each hand-in's submission
        time is stored (grader/deadlines.py): from ``times`` (the instructor's timestamps
        file) where it names the student, else what the layout gives."""
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
        trial = Cgroup.create(Limits()) if use_sandbox else None
        if trial is not None:
            trial.remove()
        elif use_sandbox:
            self.log(f"note: no cgroup for the kernels ({Cgroup.unavailable_reason}): memory "
                     "limits do not count shared memory, and a busy submission can slow the "
                     "one graded beside it (see README, 'How a submission is graded')")
        limits = limits or Limits()
        deadlines = self.deadlines()
        stamped = deadlines_mod.times_file(times, deadlines.zone if deadlines else None) \
            if times is not None else {}
        statuses: dict[str, dict[str, str]] = {}
        with _unpacked(submissions, self.root) as received:
            layout, handins, notes = recognise(received.root, lesson.name,
                                               lesson.notebook.name, layout,
                                               received.refused_members,
                                               display_name(str(submissions)))
            received.notes += notes
            if not handins:
                refused = "".join(f"\n  {note}" for note in received.notes[:20])
                raise CourseError(f"{display_name(str(submissions))} holds no hand-ins "
                                  f"(read as {LABELS[layout]}; expected SUBMISSIONS/<student_id>/"
                                  "<notebook>.ipynb, or an LMS's download as it came)" + refused)
            late = sum(h.late for h in handins)
            self.log(f"recognised {LABELS[layout]}: {len(handins)} student(s)"
                     + (f", {late} marked late" if late else "")
                     + ("" if layout in ("folders", "nbgrader") else
                        " (override with --from if that is wrong)"))
            for note in received.notes:
                self.log(note)
            self._handins[lesson.name] = {h.student_id: h.record(layout) for h in handins}
            if not keep_handins:  # a regrade keeps the time of the original hand-in
                try:
                    self._store_times(lesson, layout, handins, received, stamped, deadlines)
                except Exception as error:  # the grades matter more than the times
                    self.log(f"note: the submission times could not be stored "
                             f"({type(error).__name__}: {inert(str(error), 200)}); no late "
                             "penalty can be computed for this batch")
            if keep_handins:
                before = self.statuses(lesson.name).get(lesson.name, {})
                self._handins[lesson.name].update({
                    s: before[s]["handin"] for s in self._handins[lesson.name]
                    if before.get(s, {}).get("handin")})
            progress = Progress(len(handins), self.log, self._handins[lesson.name])
            stored = self._stored(lesson) if resume else {}
            review = (discard_overrides, by)
            self.skipped = []
            try:
                self._grade_batch(lesson, handins, stored, review, progress, statuses, limits,
                                  partial, use_sandbox, broker, jobs)
            finally:
                progress.finish()
                self._record(lesson, statuses)
        return statuses

    def _stored(self, lesson: Lesson) -> dict[str, dict]:
        """What the ledger holds for ``lesson``, read once for --resume (waiting a while for a
        database that does not answer)."""
        if not self.has_gradebook():
            return {}
        return retrying(lambda: ledger.read(self.db_url, lesson.name).get(lesson.name, {}),
                        what=f"the gradebook's database ({database_name(self.db_url)})",
                        is_transient=is_database_error, log=self.log)

    def _grade_batch(self, lesson: Lesson, handins: list[Handin], stored: dict[str, dict],
                     review: tuple[bool, str | None], progress: Progress,
                     statuses: dict[str, dict[str, str]], limits: Limits, partial: bool,
                     use_sandbox: bool, broker: str | None, jobs: int) -> None:
        """Receive, grade and store each hand-in, ``jobs`` at once. Each submission is stored
        as one unit as soon as it is graded. A fault of the grader's own infrastructure (the
        database, the broker, the disk: grader/faults.py) stops the batch early: what is
        stored stays, nothing is charged to a student, and --resume finishes the rest."""
        pending = []
        for handin in handins:
            check_space([self.root, Path(tempfile.gettempdir())])
            early = self._receive(lesson, handin)
            if isinstance(early, Graded):
                statuses[early.student_id] = progress.done(
                    self._store(lesson, early, review)).outcome()
            elif stored.get(handin.student_id, {}).get("notebook_sha256") == early[3]:
                progress.skip(handin.student_id)  # the same notebook is stored whole already
                self.skipped.append(handin.student_id)
            else:
                pending.append(early)

        def store(graded: Graded, digest: str) -> None:
            graded.notebook_sha256 = digest
            with self._gradebook_lock:
                self._store(lesson, graded, review)
            statuses[graded.student_id] = progress.done(graded).outcome()

        if broker is not None:
            self._grade_on_workers(lesson, pending, limits, partial, use_sandbox, broker, store,
                                   jobs)
            return

        def work(item: tuple[str, Path, list[str], str]) -> tuple[Graded, str]:
            student_id, notebook, notes, digest = item
            check_space([self.root, Path(tempfile.gettempdir())])
            try:
                graded = grade_submission(notebook, "; ".join(notes), lesson, student_id,
                                          self.db_url, limits, use_sandbox,
                                          self._gradebook_lock, partial)
            except Unavailable:
                raise
            except Exception as error:  # a bug of ours must not stop the batch
                graded = Graded(student_id, "needs_review", [
                    f"grading error: {type(error).__name__}: {error}"[:500]])
            if graded.status != "graded" and any("grading error" in r for r in graded.reasons):
                check_space([self.root, Path(tempfile.gettempdir())])  # the disk, not the code
            return graded, digest

        stop: Unavailable | None = None
        pool = ThreadPoolExecutor(max_workers=max(1, jobs))
        futures = [pool.submit(work, item) for item in pending]
        try:
            for future in as_completed(futures):
                try:
                    graded, digest = future.result()
                    if stop is None:
                        store(graded, digest)
                except Unavailable as fault:
                    if stop is None:
                        stop = fault
                        for other in futures:
                            other.cancel()
                except CancelledError:
                    continue
        finally:  # interrupted (Ctrl-C, SIGTERM) or stopped: no new submission starts
            pool.shutdown(wait=True, cancel_futures=True)
        if stop is not None:
            raise stop

    def deadlines(self):
        """The deadlines file (grader/deadlines.py), or None where there is none; each extension
        given to the student of the gradebook it names. Its warnings (a lesson the course does
        not have, an extension that names no one) are said once per command."""
        found = deadlines_mod.load(self.deadlines_file, required=self.deadlines_file
                                   != self.root / "deadlines.toml")
        if found is None:
            return None
        from grader.deadlines_check import people

        found.resolve(people(self.db_url) if self.has_gradebook() else {})
        said = self.__dict__.setdefault("_deadline_warnings", set())
        for warning in found.warnings:
            if warning not in said:
                said.add(warning)
                self.log(f"warning: {warning}")
        return found

    def _store_times(self, lesson: Lesson, layout: str, handins: list[Handin],
                     received: Received, stamped: dict[str, tuple[float, str]],
                     deadlines) -> None:
        """Each hand-in's submission time, from what can be trusted, best first: the
        instructor's timestamps file (``--times``: our CSV, Moodle's grading worksheet, Canvas's
        submissions JSON), Gradescope's ``created_at``, Blackboard's attempt date, a
        ``timestamp.txt`` our own collect wrote (grader/exchange.py), Canvas's LATE mark.
        Never a zip member's time (an LMS stamps its zip when it is made: Moodle's "Download
        all submissions" gives every file the time of the download) nor a ``timestamp.txt``
        the student wrote (``nbgrader collect`` copies it as the student left it): those
        hand-ins have no time and pay no penalty, and a student's own stamp is flagged for a
        look where the lesson has a due date. Says where the times came from."""
        from collections import Counter
        from datetime import datetime, timezone

        from grader.exchange import COLLECTED

        zone = deadlines.zone if deadlines else None
        due = deadlines is not None and lesson.name in deadlines.due
        ours = _same_folder(received.root, self.root / COLLECTED)
        rows, counts = {}, Counter()
        for handin in handins:
            if not valid_student_id(handin.student_id):
                continue
            at, source = handin.submitted_at, handin.time_source
            if handin.student_id in stamped:
                at, source = stamped[handin.student_id]
            elif layout == "nbgrader" and at is not None and ours:
                source = "timestamp.txt (written by python -m grader collect)"
            elif layout == "nbgrader" and at is not None:
                claimed = _iso(datetime.fromtimestamp(at, timezone.utc)) \
                    if deadlines_mod.plausible(at) else "a time out of range"
                at, source = None, (f"none: timestamp.txt says {claimed}, but the student wrote"
                                    " it (not python -m grader collect)")
                if due:
                    handin.reasons.append(
                        f"its timestamp.txt says {claimed}, but the student's side wrote it "
                        "(nbgrader collect copies it as the student left it), so no late penalty"
                        " is charged: give the time with --times FILE, or collect with python "
                        "-m grader collect")
            elif at is None and handin.local_time:
                at = deadlines_mod.naive_time(handin.local_time, zone, "Blackboard's date")
                source = "Blackboard's attempt date" if at is not None else \
                    "none: Blackboard's attempt date, with no timezone in the deadlines file " \
                    "to read it in"
            if at is None and not source:
                source = "Canvas's LATE mark" if handin.late else (
                    "Canvas: not marked late" if layout == "canvas" else
                    f"none: no submission time in {LABELS[layout]}")
            rows[handin.student_id] = {"submitted_at": at, "source": source,
                                       "late_mark": handin.late}
            counts[f"from {source}" if at is not None else "" if source.startswith("none")
                   else {"Canvas's LATE mark": "marked late by Canvas, time unknown",
                         "Canvas: not marked late": "not marked late by Canvas"}.get(
                             source, source)] += 1
        deadlines_mod.write_times(self.db_url, lesson.name, rows)
        hint = {"moodle": "give Moodle's grading worksheet with --times FILE",
                "canvas": "give Canvas's submissions API JSON with --times FILE",
                "nbgrader": "collect with python -m grader collect, or give --times FILE",
                "blackboard": "set timezone in the deadlines file",
                }.get(layout, "give a CSV student_id,submitted_at with --times FILE")
        unknown = counts.pop("", 0)
        self.log("submission times: " + ", ".join(
            [f"{n} {what}" for what, n in counts.most_common()]
            + ([f"{unknown} unknown, so no late penalty for them ({hint})"] if unknown else [])))

    def _grade_on_workers(self, lesson: Lesson, pending: list, limits: Limits, partial: bool,
                          use_sandbox: bool, broker: str,
                          store: Callable[[Graded, str], None], jobs: int) -> None:
        """Prepare each submission here, run it on the queue's workers, judge it here (``jobs``
        at once: judging may run kernels here, for exercises judged again)."""
        from grader.autograde import prepare_submission
        from grader.distributed import grade_on_workers, make_app

        app = make_app(broker, visibility_timeout=limits.notebook_seconds + 600)
        digests, prepared = {}, []
        for student_id, notebook, notes, digest in pending:
            try:
                ready = prepare_submission(notebook, "; ".join(notes), lesson, student_id,
                                           self.db_url, self._gradebook_lock)
            except Unavailable:
                raise
            except Exception as error:  # one notebook must not stop the class
                ready = Graded(student_id, "needs_review", [
                    f"grading error: {type(error).__name__}: {error}"[:500]])
            if isinstance(ready, Graded):
                store(ready, digest)
            else:
                digests[student_id] = digest
                prepared.append(ready)
        grade_on_workers(app, lesson, prepared, limits, partial, use_sandbox,
                         lambda graded: store(graded, digests.get(graded.student_id, "")),
                         self.log, judges=jobs)

    @property
    def db_url(self) -> str:
        return self.database or f"sqlite:///{self.root / 'gradebook.db'}"

    def has_gradebook(self) -> bool:
        return self.database is not None or (self.root / "gradebook.db").exists()

    def _receive(self, lesson: Lesson, handin: Handin,
                 ) -> Graded | tuple[str, Path, list[str], str]:
        """Copy a student's notebook (and nothing else) in; what cannot be graded, say why."""
        name, reasons = handin.student_id, handin.reasons
        if not valid_student_id(name):
            what = "the folder's name" if self._handins.get(lesson.name, {}).get(
                name, {}).get("from") in ("folders", "nbgrader", None) else "the LMS's id"
            return Graded(display_name(name), "invalid", [
                f"{what} is not a student id (letters, digits and ._@+-, at most 100;"
                " rename it)", *reasons])
        try:
            target = self.root / "submitted" / name / lesson.name
            if target.exists():  # re-grading replaces the earlier submission entirely
                remove_tree(target)
            if handin.notebook is None:
                return Graded(name, "invalid", reasons or [
                    f"no notebook {lesson.notebook.name} in the submission"])
            copy = target / lesson.notebook.name
            copy_notebook(handin.notebook, copy)
            if self._handins.get(lesson.name, {}).get(name, {}).get("from") == "nbgrader":
                from grader.exchange import copy_exchange_files

                copy_exchange_files(handin.notebook.parent, target)  # feedback's secret
            digest = hashlib.sha256(copy.read_bytes()).hexdigest()
        except OSError as error:
            if is_disk_error(error):  # our disk, not the student's file
                raise Unavailable(f"the disk holding {self.root} cannot be written",
                                  describe(error)) from error
            return Graded(name, "invalid", [f"the submission could not be read "
                                            f"({error.strerror or type(error).__name__})",
                                            *reasons])
        return name, copy, list(reasons), digest

    def _store(self, lesson: Lesson, graded: Graded,
               review: tuple[bool, str | None] = (False, None)) -> Graded:
        """Store one submission as one unit: its grades (every earlier grade of it replaced),
        the review decisions in force applied again (or, with ``review[0]``, discarded, which
        the review log records), its status, reason, details and the hash of the notebook
        graded, all in one transaction of the gradebook's database. A database that does not
        answer is waited for, then ``Unavailable`` stops the batch: a submission is stored
        whole or not at all, and --resume trusts what was stored. A submission whose grades
        cannot be stored for a reason of its own is stored with no points, flagged."""
        from grader.review import state_of

        database = f"the gradebook's database ({database_name(self.db_url)})"

        def transient(error: BaseException) -> bool:
            from nbgrader.api import InvalidEntry

            # InvalidEntry: another grader added the same student at the same instant
            return is_database_error(error) or isinstance(error, InvalidEntry)

        if not valid_student_id(graded.student_id):  # no gradebook row: the ledger alone
            retrying(lambda: ledger.write(self.db_url, lesson.name, [self._row(lesson, graded)]),
                     what=database, is_transient=is_database_error, log=self.log)
            return graded
        state = retrying(lambda: state_of(self.db_url, lesson.name, graded.student_id),
                         what=database, is_transient=is_database_error, log=self.log)
        self._write_autograded(lesson, graded)
        try:
            retrying(lambda: self._commit(lesson, graded, state, review[0], review[1]),
                     what=database, is_transient=transient, log=self.log)
        except Unavailable:
            raise
        except Exception as error:  # this submission's own data: flag it, with no points
            graded.status = "needs_review"
            graded.reasons.append(f"its grades could not be saved ({type(error).__name__}: "
                                  f"{error})"[:300])
            graded.notebook, graded.verdicts = None, []
            self._write_autograded(lesson, graded)
            retrying(lambda: self._commit(lesson, graded, state, review[0], review[1]),
                     what=database, is_transient=transient, log=self.log)
        # A feedback page shows grades: one made before these is withdrawn now, so that
        # nothing (nbgrader's release_feedback, an LMS zip) hands out the old grades.
        withdraw(self, lesson, {graded.student_id})
        if state.in_force:
            who = inert(graded.student_id, 120)
            if review[0]:
                self.log(f"  {who}: review decisions discarded (--discard-overrides)")
            else:
                older = {d.notebook_sha256 for d in state.in_force} - {
                    graded.notebook_sha256, ""}
                self.log(f"  {who}: kept review decisions ({state.summary()})"
                         + ("; they were made on another notebook than this one"
                            if older and graded.notebook_sha256 else "")
                         + "; --discard-overrides drops them")
        return graded

    def _write_autograded(self, lesson: Lesson, graded: Graded) -> None:
        """The notebook as run, for feedback, in autograded/STUDENT/LESSON/ (written before
        the grades are committed: a kill in between leaves a newer notebook and the older
        grades, which --resume grades again). A full disk stops the batch."""
        autograded = self.root / "autograded" / graded.student_id / lesson.name
        try:
            if autograded.exists():
                remove_tree(autograded)
            if graded.notebook is None:
                return
            autograded.mkdir(parents=True)
            staged = autograded / f".{lesson.notebook.name}.partial"
            nbformat.write(nbformat.from_dict(text_safe(graded.notebook)), staged)
            staged.replace(autograded / lesson.notebook.name)
        except OSError as error:
            if is_disk_error(error):
                raise Unavailable(f"the disk holding {self.root} cannot be written",
                                  describe(error)) from error
            raise

    def _commit(self, lesson: Lesson, graded: Graded, state, discard: bool,
                by: str | None) -> None:
        """One transaction: the student's grades, the review decisions in force (nbgrader's
        ``manual_score``), the ledger's row; and, when discarding decisions, the log's row."""
        from grader.review import who

        ledger.engine(self.db_url)  # the course's own tables exist before the transaction
        points = {f"test-{v.name}": v.points for v in graded.verdicts} \
            if graded.notebook is not None else {}
        overrides = state.overrides if state.in_force and not discard else {}
        with self.gradebook() as gb:
            # nbgrader commits these two itself; neither changes a grade of an existing row
            gb.update_or_create_student(graded.student_id, **self._student_fields(
                lesson, graded.student_id, gb=gb))
            submission = gb.update_or_create_submission(lesson.name, graded.student_id)
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    grade.auto_score = min(points.get(grade.name, 0), grade.max_score)
                    decision = overrides.get(grade.name.removeprefix("test-"))
                    grade.manual_score = None if decision is None else min(
                        float(decision.points), float(grade.max_score))
                    grade.needs_manual_grade = False
            ledger.write_in(gb.db, lesson.name, [self._row(lesson, graded)])
            if discard and state.in_force:
                ledger.log_in(gb.db, [{"lesson": lesson.name, "student_id": graded.student_id,
                                       "action": "discard", "by": who(by), "note": "",
                                       "notebook_sha256": graded.notebook_sha256}])
            gb.db.commit()

    def _row(self, lesson: Lesson, graded: Graded) -> dict:
        """The ledger's row of a graded submission: status, reason, hash, details."""
        details = {} if graded.notebook is None else {
            "seconds": round(graded.seconds, 2),
            "flags": graded.flags,
            "exercises": {v.name: {"points": v.points, "max_points": v.max_points,
                                   "passed": v.passed, "total": v.total, "note": v.note,
                                   "failures": v.visible_failures[:10],
                                   "hidden_failed": v.hidden_failed}
                          for v in graded.verdicts}}
        handin = self._handins.get(lesson.name, {}).get(graded.student_id)
        if handin:
            details["handin"] = handin
        return {"student_id": graded.student_id, "status": graded.status,
                "reason": graded.reason, "notebook_sha256": graded.notebook_sha256,
                "details": details}

    def _student_fields(self, lesson: Lesson, student_id: str, gb=None) -> dict[str, str]:
        """What nbgrader's Student row keeps of a hand-in, for formgrader and ``nbgrader
        export``: the name, the e-mail and the LMS's own id. A name or e-mail the row has
        already (the roster: ``nbgrader db student import``, formgrader, an earlier hand-in)
        wins over the download's, which the student may have typed (Gradescope's ``:name:``,
        Blackboard's ``Name:``). Whatever the row keeps is written neutral
        (``_gradebook_text``). ``gb``: the open gradebook to read the row from (else one is
        opened)."""
        from nbgrader.api import Student

        def stored(book) -> tuple[str | None, str | None, str | None]:
            row = book.db.query(Student).filter(Student.id == student_id).one_or_none()
            return (row.first_name, row.last_name, row.email) if row else (None, None, None)

        if gb is not None:
            first, last, email = stored(gb)
        else:
            with self.gradebook() as own:
                first, last, email = stored(own)
        record = self._handins.get(lesson.name, {}).get(student_id) or {}
        fields = {"first_name": first, "last_name": last} if first or last else {
            "last_name": record.get("name")}
        fields["email"] = email or record.get("email")
        if record and record.get("from") not in ("folders", "nbgrader"):
            fields["lms_user_id"] = record.get("lms_id") or student_id
        return {key: _gradebook_text(value) for key, value in fields.items() if value}

    def _record(self, lesson: Lesson, statuses: dict[str, dict[str, str]]) -> None:
        """Write grading_status.json, a copy of the whole ledger for people and scripts (the
        ledger itself is written submission by submission). Where the database cannot be
        read now, the copy waits for the next command."""
        try:
            copy = json.dumps(self.statuses(), indent=1, sort_keys=True)
        except CourseError:
            return
        path = self.root / STATUS_FILE
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            tmp.write_text(copy)
            tmp.replace(path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()

    # ------------------------------------------------------------------ export

    def statuses(self, lesson: str | None = None) -> dict[str, dict[str, dict]]:
        """lesson -> student -> status, reason, exercises: from the ledger."""
        if not self.has_gradebook():
            return {}
        try:
            return ledger.read(self.db_url, lesson)
        except Exception as error:
            raise CourseError(f"cannot read the grading ledger in {self.db_url}: "
                              f"{type(error).__name__}: {error}") from None

    def grades(self) -> list[dict[str, object]]:
        """One row per student and lesson: scores from the gradebook, status from our ledger,
        the review decisions in force applied (grader/review.py). A submission refused before
        it reached the gradebook (a folder whose name is no student id) has a row too, with
        score 0.

        ``score`` is the final score (an exercise's score set in review is in the gradebook;
        a lesson's score set in review replaces the sum), ``computed_score`` the grader's own,
        ``status`` ``graded`` once a decision settled a flag (``computed_status``: the
        grader's), ``exercises``: name -> score, computed, max_score."""
        from grader.review import states

        statuses = self.statuses()
        if not self.has_gradebook():
            return []
        decisions = states(self.db_url)
        rows = []
        with self.gradebook() as gb:
            exercises = _exercise_grades(gb)
            for assignment in sorted(gb.assignments, key=lambda a: a.name):
                for submission in sorted(assignment.submissions, key=lambda s: s.student.id):
                    status = statuses.get(assignment.name, {}).get(submission.student.id, {})
                    max_score = float(assignment.max_score)
                    per = exercises.get((assignment.name, submission.student.id), {})
                    score = min(max(float(submission.score), 0.0), max_score)
                    computed = min(max(sum(e["computed"] for e in per.values()), 0.0),
                                   max_score) if per else score
                    rows.append({
                        "student_id": submission.student.id,
                        "lesson": assignment.name,
                        "score": score,
                        "max_score": max_score,
                        "status": status.get("status", "graded"),
                        "reason": status.get("reason", ""),
                        **_handin_fields(status),
                        "computed_score": computed,
                        "exercises": per,
                    })
            max_scores = {a.name: float(a.max_score) for a in gb.assignments}
        known = {(row["student_id"], row["lesson"]) for row in rows}
        for lesson, students in sorted(statuses.items()):
            for student, status in sorted(students.items()):
                if (student, lesson) not in known and lesson in max_scores:
                    rows.append({"student_id": student, "lesson": lesson, "score": 0.0,
                                 "max_score": max_scores[lesson],
                                 "status": status.get("status", "invalid"),
                                 "reason": status.get("reason", ""), **_handin_fields(status),
                                 "computed_score": 0.0, "exercises": {}})
        for row in rows:
            row["computed_status"] = row["status"]
            state = decisions.get((str(row["lesson"]), str(row["student_id"])))
            in_force = state.in_force if state else []
            row["review"] = state.summary() if state else ""
            row["review_note"] = "; ".join(d.note for d in in_force if d.note)
            row["reviewed_by"] = f"{in_force[-1].by} {in_force[-1].when}" if in_force else ""
            if state is not None:
                if state.total is not None:
                    row["score"] = min(max(float(state.total.points or 0.0), 0.0),
                                       float(row["max_score"]))
                if state.resolved and row["status"] != "graded":
                    row["status"] = "graded"
        self._apply_deadlines(rows)
        return rows

    def _apply_deadlines(self, rows: list[dict]) -> None:
        """The late penalty, after review: ``raw_score`` is the score review left,
        ``late_penalty`` the points lost, ``score`` what remains (grader/deadlines.py)."""
        deadlines = self.deadlines()
        times = deadlines_mod.read_times(self.db_url) if deadlines else {}
        for row in rows:
            raw = float(row["score"])
            row.update(raw_score=raw, late_penalty=0.0, submitted_at="", time_source="",
                       due="", late_note="")
            if deadlines is None:
                continue
            known = times.get((str(row["lesson"]), str(row["student_id"])),
                              {"submitted_at": None, "source": "none", "late_mark": False})
            late = deadlines.judge(str(row["lesson"]), str(row["student_id"]),
                                   known["submitted_at"], known["source"],
                                   bool(known["late_mark"]))
            penalty = round(raw * late.fraction, 6)
            row.update(late_penalty=penalty, score=raw - penalty,
                       submitted_at=_iso(late.submitted), time_source=late.source,
                       due=_iso(late.due) + (" (extended)" if late.extended else ""),
                       late_note=late.note)

    # ------------------------------------------------------------------ feedback

    def feedback(self, lesson: Lesson, zips: bool = False) -> Path:
        """nbgrader's feedback page for every graded student (grader/feedback.py), each
        earlier page withdrawn first: no page outlives the grades it shows. With ``zips``,
        also the pages as the students' LMS takes them back, in feedback-zips/LESSON/."""
        from grader.feedback import write_pages

        return write_pages(self, lesson, zips)

    def current_feedback(self, lesson: Lesson) -> list[Path]:
        """The feedback pages of ``lesson`` not older than their student's grades: the only
        ones to hand out (a stale one is withdrawn)."""
        from grader.feedback import current_pages

        return current_pages(self, lesson)


class Progress:
    """Submissions done, failed and remaining: one line each, or a live line on a terminal."""

    def __init__(self, total: int, log: Callable[[str], None],
                 handins: dict[str, dict] | None = None):
        self.total, self.log, self.handins = total, log, handins or {}
        self.counts = {"graded": 0, "needs_review": 0, "invalid": 0}
        self.live = sys.stderr.isatty()

    def done(self, graded: Graded) -> Graded:
        self.counts[graded.status] += 1
        finished = sum(self.counts.values())
        handin = self.handins.get(graded.student_id, {})
        who = ", ".join(x for x in (handin.get("name", ""), "LATE" if handin.get("late") else "")
                        if x)
        remarks = "; ".join(handin.get("remarks", []))
        line = (f"[{finished}/{self.total}] {inert(graded.student_id, 120)}"
                + (f" ({inert(who, 120)})" if who else "") + f": {graded.status}"
                + (f" ({inert(graded.reason)})" if graded.reason else "")
                + (f" [{inert(remarks)}]" if remarks else ""))
        self.log(line)
        if self.live:
            bar = "#" * (30 * finished // self.total)
            print(f"\r[{bar:<30}] {finished}/{self.total} done, "
                  f"{self.counts['needs_review'] + self.counts['invalid']} flagged or failed, "
                  f"{self.total - finished} remaining", end="", file=sys.stderr, flush=True)
        return graded

    def skip(self, student_id: str) -> None:
        self.log(f"skipped {inert(student_id, 120)}: this notebook is graded already (--resume)")
        self.total -= 1

    def finish(self) -> None:
        if self.live:
            print(file=sys.stderr)


@contextmanager
def _unpacked(submissions: Path, course_root: Path) -> Iterator[Received]:
    """The submissions as a folder of student folders; a zip is unpacked safely first."""
    try:
        is_folder = submissions.is_dir()
    except OSError as error:
        raise CourseError(f"cannot read {display_name(str(submissions))}: "
                          f"{error.strerror}") from None
    if is_folder:
        yield Received(submissions)
        return
    if not zipfile.is_zipfile(submissions):
        raise CourseError(f"{display_name(str(submissions))} is neither a folder nor a zip file")
    remove_leftovers(course_root)
    tmp = Path(tempfile.mkdtemp(dir=course_root, prefix=f"{UNZIP}{socket.gethostname()}-"
                                                          f"{os.getpid()}-"))
    try:
        yield unpack_zip(submissions, tmp, named_by_lms)
    finally:
        remove_tree(tmp)


UNZIP = "unzip-"  # a zip's members, unpacked in the course directory for one batch
LEFTOVER_SECONDS = 6 * 3600  # an unzip folder of no known process, untouched this long


def remove_leftovers(course_root: Path) -> list[str]:
    """Remove the unzip folders of batches that were killed (SIGKILL leaves them, holding
    students' files): those of this machine whose process is gone, and any of no known process
    left untouched for hours. Another grader's live batch keeps its folder."""
    removed = []
    host = socket.gethostname()
    for folder in course_root.glob(f"{UNZIP}*"):
        name = folder.name.removeprefix(UNZIP)
        owner, _, rest = name.rpartition("-")[0].rpartition("-")
        try:
            pid = int(rest) if owner == host else None
        except ValueError:
            pid = None
        try:
            stale = (not process_alive(pid) if pid is not None else
                     owner != host and time.time() - folder.stat().st_mtime > LEFTOVER_SECONDS)
            if stale and folder.is_dir() and not folder.is_symlink():
                remove_tree(folder)
                removed.append(folder.name)
        except OSError:
            continue
    return removed


def _same_folder(one: Path, other: Path) -> bool:
    try:
        return Path(one).resolve() == Path(other).resolve()
    except OSError:
        return False


def _gradebook_text(value: object) -> str:
    """A name or e-mail as nbgrader's gradebook keeps it: neutral wherever nbgrader shows it.
    nbgrader 0.9.6's ``export`` joins fields with commas, unquoted, so a comma or semicolon (a
    separator in some locales) or a double quote would move the columns, and a field that
    begins with = + - @ is a formula; formgrader's grading page prints first and last name
    into its HTML unescaped. So: control characters escaped (``inert``), at most 120
    characters, no , ; " < > & (written in their fullwidth forms), and a leading ' before a
    formula's first character, as export.py writes names."""
    text = inert(value, 120).translate(_GRADEBOOK_LOOKALIKES)
    text = " ".join(text.split())
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


# The fullwidth forms of the characters nbgrader's export and formgrader would read as syntax.
_GRADEBOOK_LOOKALIKES = str.maketrans({",": "\uff0c", ";": "\uff1b", '"': "\uff02",
                                       "<": "\uff1c", ">": "\uff1e", "&": "\uff06"})


def _exercise_grades(gb) -> dict[tuple[str, str], dict[str, dict[str, float]]]:
    """(lesson, student) -> exercise -> score (the gradebook's: a score set in review counts),
    computed (the grader's) and max_score, in the lesson's order; one query for the course."""
    from nbgrader.api import (
        Assignment,
        Grade,
        GradeCell,
        SubmittedAssignment,
        SubmittedNotebook,
    )

    found: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
    query = (gb.db.query(Assignment.name, SubmittedAssignment.student_id, GradeCell.name,
                         Grade.auto_score, Grade.manual_score, Grade.extra_credit,
                         GradeCell.max_score)
             .select_from(Grade)
             .join(SubmittedNotebook, Grade.notebook_id == SubmittedNotebook.id)
             .join(SubmittedAssignment, SubmittedNotebook.assignment_id == SubmittedAssignment.id)
             .join(Assignment, SubmittedAssignment.assignment_id == Assignment.id)
             .join(GradeCell, Grade.cell_id == GradeCell.id))
    for lesson, student, cell, auto, manual, extra, maximum in query:
        computed = float(auto or 0.0)
        score = (float(manual) if manual is not None else computed) + float(extra or 0.0)
        found.setdefault((lesson, student), {})[cell.removeprefix("test-")] = {
            "score": min(max(score, 0.0), float(maximum)), "computed": computed,
            "max_score": float(maximum)}
    order = _cell_order({lesson for lesson, _ in found})
    return {key: dict(sorted(value.items(), key=lambda item: (order.get((key[0], item[0]), 0),
                                                              item[0])))
            for key, value in found.items()}


def _cell_order(lessons: set[str]) -> dict[tuple[str, str], int]:
    """(lesson, exercise) -> its place in the lesson's notebook."""
    from grader.lessons import load_lesson

    order = {}
    for name in lessons:
        try:
            cells = nbformat.read(load_lesson(name).notebook, as_version=4).cells
        except (CourseError, OSError):
            continue
        ids = [c.metadata.get("nbgrader", {}).get("grade_id", "") for c in cells]
        for place, grade_id in enumerate(i for i in ids if i.startswith("test-")):
            order[(name, grade_id.removeprefix("test-"))] = place
    return order


def _handin_fields(status: dict) -> dict[str, object]:
    """What a grade row shows of the hand-in: the name, the LMS's late mark, its layout."""
    handin = status.get("handin") or {}
    return {"name": handin.get("name", ""), "late": bool(handin.get("late")),
            "from": handin.get("from", ""), "email": handin.get("email", ""),
            "remarks": handin.get("remarks", []), "lms_id": handin.get("lms_id", "")}


def _iso(when) -> str:
    return when.isoformat(timespec="seconds") if when is not None else ""


def _nbgrader_templates() -> str:
    """nbgrader's own template folder (its feedback template, which ours extends)."""
    import nbgrader

    return str(Path(nbgrader.__file__).resolve().parent / "server_extensions" / "formgrader"
               / "templates")


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def open_course(course_dir: str | None, log: Callable[[str], None] = print,
                db_url: str | None = None, deadlines: str | None = None) -> Course:
    return Course(Path(course_dir) if course_dir else DEFAULT_COURSE_DIR, log, db_url,
                  Path(deadlines) if deadlines else None)
