"""The instructor's commands on a large class: how long each takes, and how many queries.

    .venv/bin/python benchmarks/class_scale.py [--students 10000] [--lesson 01_float_formats]
                                               [--feedback-sample 300]

A course of N graded hand-ins is made without grading N notebooks: three real hand-ins are
graded (the instructor's notebook, one with a wrong exercise, the untouched student version),
then ``clone_class`` copies their rows in nbgrader's gradebook and the grader's ledger, and
hard-links their files, under N student ids (numbers, as an LMS's are, each with an e-mail and
an LMS user id on a roster). Every command then reads what a class of N graded by the grader
would hold. For each of ``report``, ``export`` (csv, per exercise, per person; Canvas's and
Moodle's import files from the roster, the lesson's Moodle grading worksheet filled in),
``review`` (the list of flagged), ``variants`` and a student's ``progress`` (which runs
their own copy of the lesson) it prints the wall time and the SQL statements it sent (counted
on SQLAlchemy's engines).
``feedback``'s first run, which makes a page per student, is timed on a class of
``--feedback-sample`` students made the same way, and so is its second (nothing changed). A
script that prints figures, not a test: tests/test_term_state.py keeps the number of
statements from growing with the class.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import io
import os
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# The nbgrader tables a graded hand-in has rows in, each with the column that ties a row to its
# parent (the student, then the submitted assignment, then the submitted notebook).
SUBMISSION_TABLES = ("submitted_assignment", "submitted_notebook", "grade", "comment")


def graded_templates(course: Path, lesson_name: str) -> list[str]:
    """Release ``lesson_name`` into ``course`` and grade three hand-ins there (in this
    process): the instructor's notebook, one exercise wrong, the untouched student version.
    Returns their student ids."""
    import nbformat

    from grader.cli import main
    from grader.content.lessons import load_lesson

    lesson = load_lesson(lesson_name)
    quiet(main, ["release", lesson.name, "--course-dir", str(course)])
    instructor = nbformat.read(lesson.notebook, as_version=4)
    wrong = copy.deepcopy(instructor)
    solved = [c for c in wrong.cells if c.metadata.get("nbgrader", {}).get("solution")]
    solved[0].source = solved[0].source + "\n    raise ValueError('wrong on purpose')\n"
    untouched = nbformat.read(course / "release" / lesson.name / lesson.notebook.name,
                              as_version=4)
    folder = course.parent / "handins"
    for student, nb in (("tpl_right", instructor), ("tpl_wrong", wrong),
                        ("tpl_untouched", untouched)):
        (folder / student).mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, folder / student / lesson.notebook.name)
    quiet(main, ["autograde", lesson.name, str(folder), "--course-dir", str(course),
                 "--jobs", "2"])
    return ["tpl_right", "tpl_wrong", "tpl_untouched"]


def clone_class(course: Path, templates: list[str], students: list[str]) -> None:
    """Give each of ``students`` a copy of a template's grade (in turn): its rows in the
    gradebook (nbgrader's and the ledger's, with new ids) and its files (hard links)."""
    db = sqlite3.connect(course / "gradebook.db")
    try:
        columns = {t: [r[1] for r in db.execute(f"PRAGMA table_info({t})")]
                   for t in ("student", *SUBMISSION_TABLES, "ctc_grading_status")}
        rows = {}
        for template in templates:
            assignment = db.execute("SELECT * FROM submitted_assignment WHERE student_id = ?",
                                    (template,)).fetchall()
            notebooks = db.execute("SELECT * FROM submitted_notebook WHERE assignment_id = ?",
                                   (assignment[0][0],)).fetchall()
            rows[template] = {
                "student": db.execute("SELECT * FROM student WHERE id = ?",
                                      (template,)).fetchall(),
                "submitted_assignment": assignment,
                "submitted_notebook": notebooks,
                "grade": db.execute("SELECT * FROM grade WHERE notebook_id = ?",
                                    (notebooks[0][0],)).fetchall(),
                "comment": db.execute("SELECT * FROM comment WHERE notebook_id = ?",
                                      (notebooks[0][0],)).fetchall(),
                "ctc_grading_status": db.execute(
                    "SELECT * FROM ctc_grading_status WHERE student_id = ?",
                    (template,)).fetchall()}
        inserts: dict[str, list[tuple]] = {t: [] for t in columns}
        for number, student in enumerate(students):
            template = templates[number % len(templates)]
            found = rows[template]
            ids = {found["submitted_assignment"][0][0]: uuid.uuid4().hex,
                   found["submitted_notebook"][0][0]: uuid.uuid4().hex}
            for table, values in found.items():
                names = columns[table]
                for row in values:
                    record = dict(zip(names, row, strict=True))
                    for key in ("id", "assignment_id", "notebook_id"):
                        if key in record and record[key] in ids:
                            record[key] = ids[record[key]]
                    if table in ("grade", "comment"):
                        record["id"] = uuid.uuid4().hex
                    if table in ("student", "submitted_assignment", "ctc_grading_status"):
                        record["id" if table == "student" else "student_id"] = student
                    if table == "student":
                        record["email"] = student if "@" in student else \
                            f"student{student}@uni.edu"
                    inserts[table].append(tuple(record[n] for n in names))
        with db:
            for table, values in inserts.items():
                marks = ", ".join("?" * len(columns[table]))
                db.executemany(f"INSERT INTO {table} VALUES ({marks})", values)
    finally:
        db.close()
    for folder in ("submitted", "autograded"):
        for number, student in enumerate(students):
            source = course / folder / templates[number % len(templates)]
            for path in source.rglob("*"):
                target = course / folder / student / path.relative_to(source)
                if path.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.link(path, target)


@contextlib.contextmanager
def counted() -> Iterator[list[int]]:
    """The number of SQL statements sent meanwhile, on every SQLAlchemy engine (nbgrader's
    gradebook and the grader's ledger), as ``found[0]`` once the block ends."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    found = [0]

    def count(*_args) -> None:
        found[0] += 1

    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield found
    finally:
        event.remove(Engine, "before_cursor_execute", count)


def quiet(function, argv: list[str]) -> int:
    """``function(argv)`` with its printing kept (a command's output), returned as its code."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = function(argv)
    if code != 0:
        raise SystemExit(f"{' '.join(argv)} exited {code}")
    return code


def lms_files(course: Path, lesson: str, out: Path) -> dict[str, Path]:
    """What an instructor gives the LMS exports, for every student in the course's gradebook,
    written under ``out``: a roster (an LMS user id and an e-mail each), Canvas's assignments
    file, and the lesson's Moodle grading worksheet (a row per student whose id is a number, as
    Moodle's participant ids are)."""
    db = sqlite3.connect(course / "gradebook.db")
    try:  # the e-mails clone_class gave; the templates' own, which have none, made up alike
        students = [(student, email or f"student{student}@uni.edu") for student, email
                    in db.execute("SELECT id, email FROM student ORDER BY id")]
    finally:
        db.close()
    files = {"roster": out / "roster.csv", "assignments": out / "assignments.csv",
             "worksheet": out / "worksheet.csv"}
    with files["roster"].open("w", newline="") as handle:
        table = csv.writer(handle)
        table.writerow(["student_id", "name", "lms_id", "email"])
        for number, (student, email) in enumerate(students):
            table.writerow([student, f"Student {number}", 5_000_000 + number, email])
    files["assignments"].write_text(f"lesson,title,id,points\n{lesson},The lesson,4242,\n")
    with files["worksheet"].open("w", newline="") as handle:
        table = csv.writer(handle)
        table.writerow(["Identifier", "Full name", "Email address", "Status", "Grade",
                        "Maximum Grade", "Grade can be changed", "Last modified (submission)",
                        "Last modified (grade)"])
        for number, (student, email) in enumerate(students):
            if student.isdigit():
                table.writerow([f"Participant {student}", f"Student {number}", email,
                                "Submitted for grading", "", "100.00", "Yes", "-", "-"])
    return files


def commands(course: Path, lesson: str, out: Path) -> list[tuple[str, list[str]]]:
    """The instructor's commands measured, each as a name and its arguments (the LMS exports
    read the files ``lms_files`` writes under ``out``)."""
    where = ["--course-dir", str(course)]
    roster = ["--roster", str(out / "roster.csv")]
    return [
        ("report", ["report", lesson, *where]),
        ("export csv", ["export", "--csv", str(out / "grades.csv"), *where]),
        ("export --per-exercise", ["export", "--per-exercise", "--csv",
                                   str(out / "exercises.csv"), *where]),
        ("export --per-person", ["export", "--per-person", "--csv",
                                 str(out / "people.csv"), *where]),
        ("export canvas", ["export", "--format", "canvas", *roster, "--assignments",
                           str(out / "assignments.csv"), "--csv", str(out / "canvas.csv"),
                           *where]),
        ("export moodle", ["export", "--format", "moodle", *roster, "--csv",
                           str(out / "moodle.csv"), *where]),
        ("export moodle-worksheet", ["export", "--format", "moodle-worksheet", "--roster",
                                     str(out / "worksheet.csv"), "--lesson", lesson, "--csv",
                                     str(out / "worksheet-filled.csv"), *where]),
        ("review (the flagged)", ["review", lesson, *where]),
        ("variants (every code)", ["variants", *where]),
    ]


def measure(course: Path, lesson: str, out: Path) -> list[tuple[str, float, int]]:
    """Each command's wall time and SQL statements, run in this process."""
    from grader.cli import main

    lms_files(course, lesson, out)
    found = []
    for name, argv in commands(course, lesson, out):
        with counted() as statements:
            start = time.perf_counter()
            quiet(main, argv)
            seconds = time.perf_counter() - start
        found.append((name, seconds, statements[0]))
    return found


def student_workspace(course: Path, lesson: str, out: Path) -> Path:
    """A student's workspace under ``out``: the released copy of ``lesson``, untouched, and the
    id of the class's first student (as ``lab --student`` remembers it), for ``progress``."""
    import json

    from grader.content.lessons import load_lesson
    from grader.lab.server import STUDENT_FILE

    notebook = load_lesson(lesson).notebook.name
    workspace = out / "workspace"
    (workspace / lesson).mkdir(parents=True, exist_ok=True)
    shutil.copy(course / "release" / lesson / notebook, workspace / lesson / notebook)
    first = sqlite3.connect(course / "gradebook.db")
    try:
        student = first.execute("SELECT id FROM student ORDER BY id LIMIT 1").fetchone()[0]
    finally:
        first.close()
    (workspace / STUDENT_FILE).write_text(json.dumps({"student": student, "code": None}))
    return workspace


def measure_progress(course: Path, lesson: str, out: Path) -> tuple[float, int]:
    """``progress`` of one student of the class (their own copy of ``lesson``, run as Validate
    runs it, with their numbers drawn with the course's key): seconds and SQL statements. What
    it reads of the course is the key's fingerprint; the rest is the student's notebook."""
    from grader.cli import main

    workspace = student_workspace(course, lesson, out)
    with counted() as statements:
        start = time.perf_counter()
        quiet(main, ["progress", lesson, "--workspace", str(workspace), "--course-dir",
                     str(course)])
        seconds = time.perf_counter() - start
    return seconds, statements[0]


def make_class(root: Path, lesson: str, students: int) -> Path:
    """A course directory under ``root`` with ``students`` graded hand-ins of ``lesson``."""
    course = root / "course"
    templates = graded_templates(course, lesson)
    clone_class(course, templates, [str(1_000_000 + n) for n in range(students)])
    return course


def measure_feedback(root: Path, lesson: str, students: int) -> tuple[float, float]:
    """``feedback``'s first run on a class of ``students`` (every page made) and its second
    (nothing changed: every page kept), in seconds."""
    from grader.cli import main

    course = make_class(root / "feedback-sample", lesson, students)
    argv = ["feedback", lesson, "--course-dir", str(course)]
    start = time.perf_counter()
    quiet(main, argv)
    first = time.perf_counter() - start
    start = time.perf_counter()
    quiet(main, argv)
    return first, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=10_000)
    parser.add_argument("--lesson", default="01_float_formats")
    parser.add_argument("--feedback-sample", type=int, default=300, metavar="N",
                        help="the class on which feedback's first run is timed (default: "
                             "%(default)s; 0: not timed)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ctc-class-scale-"))
    try:
        start = time.perf_counter()
        course = make_class(root, args.lesson, args.students)
        print(f"a course of {args.students:,} graded hand-ins of {args.lesson} (3 graded, the "
              f"rest copies) made in {time.perf_counter() - start:.0f} s")
        print(f"{'command':<28} {'seconds':>8} {'SQL statements':>15}")
        for name, seconds, statements in measure(course, args.lesson, root):
            print(f"{name:<28} {seconds:>8.2f} {statements:>15,}")
        seconds, statements = measure_progress(course, args.lesson, root)
        print(f"{'progress (one student)':<28} {seconds:>8.2f} {statements:>15,}  (runs their "
              "copy of the lesson)")
        if args.feedback_sample:
            first, again = measure_feedback(root, args.lesson, args.feedback_sample)
            print(f"feedback, first run on a class of {args.feedback_sample:,}: {first:.1f} s "
                  f"({args.feedback_sample / first:.1f} pages a second, the start included); "
                  f"again, nothing changed: {again:.1f} s")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
