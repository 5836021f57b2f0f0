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

import hashlib
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

from grader import deadlines as deadlines_mod
from grader import ledger
from grader.autograde import Graded, grade_submission
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
    "grader.preprocessors.RedactHiddenTests",
    "grader.preprocessors.SanitizeUntrusted",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
c.ShowLate.deadlines_file = {deadlines!r}
c.HTMLExporter.template_name = "ctc_feedback"  # nbgrader's feedback, one block changed
c.HTMLExporter.template_file = "ctc.html.j2"
c.HTMLExporter.extra_template_basedirs = [{templates!r}, {nbgrader_templates!r}]
"""


@dataclass
class Course:
    """A course directory and the nbgrader commands run in it."""

    root: Path
    log: Callable[[str], None] = print
    database: str | None = None  # a SQLAlchemy URL; None: gradebook.db in the course directory
    deadlines_file: Path | None = None  # None: deadlines.toml in the course directory

    def __post_init__(self) -> None:
        self._details: dict[str, dict[str, dict]] = {}
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
            deadlines=str(self.deadlines_file),
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
            stored = self.statuses(lesson.name).get(lesson.name, {}) if resume else {}
            review = (discard_overrides, by)
            pending = []
            try:
                for handin in handins:
                    name = handin.student_id
                    early = self._receive(lesson, handin)
                    if isinstance(early, Graded):
                        graded = progress.done(self._store(lesson, early, review))
                        statuses[graded.student_id] = graded.outcome()
                    elif stored.get(name, {}).get("notebook_sha256") == early[3]:
                        progress.skip(name)  # the same notebook is graded already
                    else:
                        pending.append(early)

                def store(graded: Graded, digest: str) -> None:
                    graded.notebook_sha256 = digest
                    with self._gradebook_lock:
                        self._store(lesson, graded, review)
                    statuses[graded.student_id] = progress.done(graded).outcome()

                if broker is not None:
                    self._grade_on_workers(lesson, pending, limits, partial, use_sandbox,
                                           broker, store, jobs)
                else:
                    def work(item: tuple[str, Path, list[str], str]) -> tuple[Graded, str]:
                        student_id, notebook, notes, digest = item
                        try:
                            return grade_submission(notebook, "; ".join(notes), lesson,
                                                    student_id, self.db_url, limits,
                                                    use_sandbox, self._gradebook_lock,
                                                    partial), digest
                        except Exception as error:  # a bug of ours must not stop the batch
                            return Graded(student_id, "needs_review", [
                                f"grading error: {type(error).__name__}: {error}"[:500]]), digest

                    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                        for graded, digest in pool.map(work, pending):
                            store(graded, digest)
            finally:
                progress.finish()
                self._record(lesson, statuses)
        return statuses

    def deadlines(self):
        """The deadlines file (grader/deadlines.py), or None where there is none."""
        return deadlines_mod.load(self.deadlines_file, required=self.deadlines_file
                                  != self.root / "deadlines.toml")

    def _store_times(self, lesson: Lesson, layout: str, handins: list[Handin],
                     received: Received, stamped: dict[str, float], deadlines) -> None:
        """Each hand-in's submission time, best source first: the timestamps file, the
        layout's own (nbgrader's timestamp.txt, Gradescope's created_at, Blackboard's attempt
        date), the notebook's time in a zip, Canvas's LATE mark; else none."""
        zone = deadlines.zone if deadlines else None
        rows = {}
        for handin in handins:
            if not valid_student_id(handin.student_id):
                continue
            at, source = handin.submitted_at, handin.time_source
            if handin.student_id in stamped:
                at, source = stamped[handin.student_id], "the timestamps file"
            elif at is None and handin.local_time:
                at = deadlines_mod.naive_time(handin.local_time, zone, "Blackboard's date")
                source = "Blackboard's attempt date" if at is not None else \
                    "Blackboard's attempt date (no timezone in the deadlines file to read it in)"
            elif at is None and handin.notebook is not None and layout != "canvas" \
                    and str(handin.notebook) in received.member_times:
                at = deadlines_mod.naive_time(received.member_times[str(handin.notebook)],
                                              zone, "zip time")
                source = "the notebook's time in the zip" if at is not None else \
                    "the zip's time (no timezone in the deadlines file to read it in)"
            if at is None and not source:
                source = "Canvas's LATE mark" if handin.late else (
                    "Canvas: not marked late" if layout == "canvas" else "none")
            rows[handin.student_id] = {"submitted_at": at, "source": source,
                                       "late_mark": handin.late}
        deadlines_mod.write_times(self.db_url, lesson.name, rows)

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
            ready = prepare_submission(notebook, "; ".join(notes), lesson, student_id,
                                       self.db_url, self._gradebook_lock)
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
            return Graded(name, "invalid", [f"the submission could not be read "
                                            f"({error.strerror or type(error).__name__})",
                                            *reasons])
        return name, copy, list(reasons), digest

    def _store(self, lesson: Lesson, graded: Graded,
               review: tuple[bool, str | None] = (False, None)) -> Graded:
        """Write one submission's grades: every earlier grade of it is replaced, and the
        review decisions in force are applied again (or, with ``review[0]``, discarded). A
        student whose id cannot be a gradebook id is recorded in the status file only."""
        from grader.review import after_grading

        if not valid_student_id(graded.student_id):
            return graded
        try:
            self._write_grades(lesson, graded)
        except Exception as error:  # one submission must not stop the batch
            graded.status = "needs_review"
            graded.reasons.append(f"its grades could not be saved ({type(error).__name__}: "
                                  f"{error})"[:300])
            graded.notebook = None
            try:
                self._zero(lesson, graded.student_id)
            except Exception as again:
                graded.reasons.append(f"nor zeroed ({type(again).__name__})")
        try:
            after_grading(self, lesson.name, graded.student_id, graded.notebook_sha256,
                          discard=review[0], by=review[1])
        except Exception as error:  # the grades stand; the decisions could not be re-applied
            graded.status = "needs_review"
            graded.reasons.append(f"the review decisions in force could not be applied again "
                                  f"({type(error).__name__}: {error})"[:300])
        return graded

    def _write_grades(self, lesson: Lesson, graded: Graded) -> None:
        self._zero(lesson, graded.student_id)
        autograded = self.root / "autograded" / graded.student_id / lesson.name
        if autograded.exists():
            remove_tree(autograded)
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
        nbformat.write(nbformat.from_dict(text_safe(graded.notebook)),
                       autograded / lesson.notebook.name)
        self._details.setdefault(lesson.name, {})[graded.student_id] = {
            "seconds": round(graded.seconds, 2),
            "flags": graded.flags,
            "exercises": {v.name: {"points": v.points, "max_points": v.max_points,
                                   "passed": v.passed, "total": v.total, "note": v.note,
                                   "failures": v.visible_failures[:10],
                                   "hidden_failed": v.hidden_failed}
                          for v in graded.verdicts},
        }

    def _zero(self, lesson: Lesson, student_id: str) -> None:
        """Record a submission with no gradable notebook: every grade 0.

        Graders of other lessons sharing the database may add the same student at the same
        instant; the one whose insert loses that race finds the student on its next try."""
        from nbgrader.api import InvalidEntry

        for attempt in range(3):
            try:
                with self.gradebook() as gb:
                    gb.update_or_create_student(student_id, **self._student_fields(
                        lesson, student_id))
                    submission = gb.update_or_create_submission(lesson.name, student_id)
                    for notebook in submission.notebooks:
                        for grade in notebook.grades:
                            grade.auto_score, grade.manual_score = 0, None
                            grade.needs_manual_grade = False
                    gb.db.commit()
                return
            except InvalidEntry:  # a duplicate key: the other grader's row is there now
                if attempt == 2:
                    raise

    def _student_fields(self, lesson: Lesson, student_id: str) -> dict[str, str]:
        """What nbgrader's Student row keeps of a hand-in: the name (for formgrader), the
        e-mail and the LMS's own id, where the download gave them."""
        record = self._handins.get(lesson.name, {}).get(student_id)
        if not record:
            return {}
        fields = {"last_name": record["name"][:120] or None,
                  "email": record["email"][:120] or None}
        if record["from"] not in ("folders", "nbgrader"):
            fields["lms_user_id"] = (record.get("lms_id") or student_id)[:120]
        return {k: v for k, v in fields.items() if v}

    def _record(self, lesson: Lesson, statuses: dict[str, dict[str, str]]) -> None:
        """Store each graded submission's status in the ledger (the gradebook's database), then
        write grading_status.json, a copy of the whole ledger, for people and scripts."""
        details = self._details.get(lesson.name, {})
        handins = self._handins.get(lesson.name, {})
        ledger.write(self.db_url, lesson.name, [
            {"student_id": student, "status": status["status"], "reason": status["reason"],
             "notebook_sha256": status.get("notebook_sha256", ""),
             "details": {**details.get(student, {}),
                         **({"handin": handins[student]} if student in handins else {})}}
            for student, status in statuses.items()])
        path = self.root / STATUS_FILE
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.statuses(), indent=1, sort_keys=True))
        tmp.replace(path)

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
        """nbgrader's feedback page for every graded student. One page that cannot be made
        does not stop the others: it is made again on its own, and named if it still fails.
        With ``zips``, also one zip per student in feedback-zips/LESSON/, for an LMS's bulk
        upload of feedback files."""
        done = self.nbgrader("generate_feedback", lesson.name, "--force")
        folder = self.root / "feedback"
        if done.returncode != 0:
            graded = sorted(p.name for p in (self.root / "autograded").iterdir()
                            if (p / lesson.name).is_dir()) \
                if (self.root / "autograded").is_dir() else []
            missing = [s for s in graded
                       if not (folder / s / lesson.name / f"{lesson.notebook_id}.html").exists()]
            failed = [s for s in missing
                      if self.nbgrader("generate_feedback", lesson.name, "--student", s,
                                       "--force").returncode != 0]
            if failed and len(failed) == len(graded):
                raise CourseError(f"nbgrader generate_feedback {lesson.name} failed:\n"
                                  + inert(_tail(done.stderr + done.stdout), 3000))
            for student in failed:
                self.log(f"no feedback page for {inert(student)}: nbgrader could not render "
                         "the graded notebook")
        self.log(f"feedback pages in {folder}/<student_id>/{lesson.name}/")
        if zips:
            self._feedback_for_lms(lesson, sorted(folder.glob(f"*/{lesson.name}/*.html")))
        return folder


    def _feedback_for_lms(self, lesson: Lesson, pages: list[Path]) -> None:
        """The feedback pages as each student's LMS takes them back, in feedback-zips/LESSON/:

        - Moodle ("Upload multiple feedback files in a zip", mod/assign/feedback/file/
          importziplib.php): one zip, a folder per student named
          ``<Full Name>_<participant id>_assignfeedback_file_`` as the download named them.
        - Canvas takes bulk feedback only through its API: a folder per student named as the
          download named them (``<name>[_LATE]_<user id>``), to attach by hand or by script.
        - Others: one zip per student, ``<student_id>.zip``.
        """
        target = self.root / "feedback-zips" / lesson.name
        if target.exists():
            remove_tree(target)
        target.mkdir(parents=True)
        records = self.statuses(lesson.name).get(lesson.name, {})
        moodle, canvas, single, skipped = [], 0, 0, []
        for page in pages:
            student = page.parent.parent.name
            handin = records.get(student, {}).get("handin") or {}
            source, named = handin.get("from"), str(handin.get("download_name", ""))
            if source in ("moodle", "canvas") and not _safe_component(named):
                skipped.append(student)
            elif source == "moodle":
                moodle.append((f"{named}_assignfeedback_file_/{page.name}", page))
            elif source == "canvas":
                (target / "canvas" / named).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(page, target / "canvas" / named / page.name)
                canvas += 1
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
            self.log(f"{len(moodle)} page(s) in {target}/moodle-feedback.zip: in the Moodle "
                     "assignment, View all submissions > Grading action > Upload multiple "
                     "feedback files in a zip")
        if canvas:
            self.log(f"{canvas} folder(s) in {target}/canvas/, one per student as Canvas's "
                     "download named them: Canvas takes feedback files only one by one (or "
                     "through its API), not as a zip")
        if single:
            self.log(f"{single} zip(s) in {target}/, one per student")
        if skipped:
            self.log(f"no LMS folder for {len(skipped)} student(s) whose download name cannot "
                     "be a file name: " + inert(", ".join(skipped), 300))


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
    tmp = Path(tempfile.mkdtemp(dir=course_root, prefix="unzip-"))
    try:
        yield unpack_zip(submissions, tmp, named_by_lms)
    finally:
        remove_tree(tmp)


def _safe_component(name: str) -> bool:
    """Whether a name the download gave can name a folder here and in a zip: one path
    component, valid UTF-8, nothing a terminal would run."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return (0 < len(name.encode()) <= 200 and name not in (".", "..") and "/" not in name
            and "\\" not in name and inert(name, 1000) == name)


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
