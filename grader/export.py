"""``python -m grader export``: grades as a CSV of our own, or as an LMS's grade import file.

- ``csv``: one row per student and lesson: ``student_id, lesson, score, max_score, status,
  reason, name, late, from, lms_id`` (``lms_id``: the LMS's own id where it could not be the
  gradebook's), then ``computed_score, review, review_note, reviewed_by`` (the grader's own
  score and the review decisions in force: grader/review.py) and a column per exercise,
  ``LESSON/EXERCISE``, then the late policy's ``raw_score, late_penalty, final_score,
  submitted_at, time_source, due, late_note`` (grader/deadlines.py; ``score`` is the final
  score, after review and penalty, and so is what the LMS exports write).
  ``export_per_exercise``: one row per student, lesson and exercise.
- ``canvas``, ``moodle``, ``moodle-worksheet``: the files each LMS's own grade import reads
  back (grader/lms_export.py): a file per lesson, a row per student with a score, never a
  blank cell (both importers read a blank as "remove the grade").

Every cell a student controls (an id, a name, a reason quoting a file name) is written so that
no spreadsheet runs it as a formula (grader/cells.py).
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from grader.cells import FORMULA_START, display, student_cell  # noqa: F401  (re-exported)
from grader.course import Course
from grader.intake import inert
from grader.lessons import CourseError

ROSTER_COLUMNS = ("name", "lms_id", "sis_user_id", "sis_login_id", "section", "email",
                  "username", "id_number")
KINDS = ("csv", "canvas", "moodle", "moodle-worksheet")
PARTICIPANT = re.compile(r"\s*Participant\s+(\d+)\s*")  # Moodle's grading worksheet


@dataclass(frozen=True)
class Assignment:
    """The LMS assignment a lesson's grades go to."""

    lesson: str
    title: str
    lms_id: str = ""
    points: float | None = None  # the LMS assignment's points possible; None: raw points

    @property
    def canvas_header(self) -> str:
        return f"{self.title} ({self.lms_id})" if self.lms_id else self.title


def read_csv(path: Path, what: str) -> list[dict[str, str]]:
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            return [{(k or "").strip(): (v or "").strip() if isinstance(v, str) else ""
                     for k, v in row.items()} for row in csv.DictReader(handle)]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise CourseError(f"cannot read the {what} {path}: {error}") from None


def read_rosters(paths: list[Path]) -> dict[str, dict[str, str]]:
    """The rosters of ``paths`` as one: Moodle's grading worksheets of several assignments hold
    different participant ids, so they add up without clashing."""
    merged: dict[str, dict[str, str]] = {}
    for path in paths:
        for student, ids in read_roster(path).items():
            known = merged.setdefault(student, dict(ids))
            for key, value in ids.items():
                known[key] = known.get(key) or value
    return merged


def read_roster(path: Path) -> dict[str, dict[str, str]]:
    """student_id -> the LMS's identifiers for that student. The roster is our own CSV (a
    ``student_id`` column and any of ROSTER_COLUMNS), Canvas's gradebook export (``Student,
    ID, SIS User ID, SIS Login ID, Section``) or Moodle's grading worksheet (``Identifier``
    "Participant N", ``Full name``, ``Email address``), as the LMS wrote it."""
    rows = read_csv(path, "roster")
    header = set(rows[0]) if rows else set()
    roster: dict[str, dict[str, str]] = {}
    if "student_id" in header:
        for row in rows:
            if row.get("student_id"):
                roster[row["student_id"]] = {k: row.get(k, "") for k in ROSTER_COLUMNS}
    elif {"Student", "ID"} <= header:
        for row in rows:
            if row.get("ID", "").isdigit():  # not "Points Possible" nor a muted-assignment row
                roster[row["ID"]] = {
                    "name": row.get("Student", ""), "lms_id": row["ID"],
                    "sis_user_id": row.get("SIS User ID", ""),
                    "sis_login_id": row.get("SIS Login ID", row.get("Login ID", "")),
                    "section": row.get("Section", ""), "email": "", "username": "",
                    "id_number": ""}
    elif "Identifier" in header:
        for row in rows:
            match = PARTICIPANT.fullmatch(row.get("Identifier", ""))
            if match:
                roster[match[1]] = {**dict.fromkeys(ROSTER_COLUMNS, ""),
                                    "name": row.get("Full name", ""),
                                    "email": row.get("Email address", ""),
                                    "id_number": row.get("ID number", "")}
    else:
        raise CourseError(
            f"the roster {path} needs a header row: a student_id column (and any of "
            f"{', '.join(ROSTER_COLUMNS)}), or Canvas's gradebook export (Student, ID, ...), or "
            "Moodle's grading worksheet (Identifier, Full name, Email address, ...)")
    return roster


def read_assignments(path: Path) -> dict[str, Assignment]:
    """lesson -> its LMS assignment, from a CSV ``lesson,title,id,points`` (id and points may
    be blank)."""
    rows = read_csv(path, "assignments file")
    if not rows or not {"lesson", "title"} <= set(rows[0]):
        raise CourseError(f"the assignments file {path} needs a header row lesson,title,id,points"
                          " (id and points may be left blank), e.g.\n"
                          "  lesson,title,id,points\n  01_float_formats,Float formats,4242,10")
    found = {}
    for number, row in enumerate(rows, start=2):
        if not row["lesson"]:
            continue
        if not row["title"]:
            raise CourseError(f"{path}, line {number}: lesson {row['lesson']} has no title")
        lms_id, points = row.get("id", ""), row.get("points", "")
        if lms_id and not lms_id.isdigit():
            raise CourseError(f"{path}, line {number}: the id {lms_id!r} is not the LMS's "
                              "number for the assignment (Canvas: the number in its address)")
        try:
            value = float(points) if points else None
        except ValueError:
            value = None
        if points and (value is None or not value > 0 or value != value or value == float("inf")):
            raise CourseError(f"{path}, line {number}: points {points!r} is not a positive "
                              "number")
        found[row["lesson"]] = Assignment(row["lesson"], row["title"], lms_id, value)
    return found


# Appended after the exercise columns (grader/deadlines.py): the score review left, the points
# the late policy took, the final score (= score), and what the penalty was computed from.
LATE_COLUMNS = ("raw_score", "late_penalty", "final_score", "submitted_at", "time_source",
                "due", "late_note")


def late_cells(row: dict) -> list:
    if row.get("score") is None:  # on the roster, no submission
        return ["", "", "", "", "", "", ""]
    return [float(row.get("raw_score", row["score"])), float(row.get("late_penalty", 0.0)),
            float(row["score"]), row.get("submitted_at", ""),
            display(str(row.get("time_source", ""))), row.get("due", ""),
            display(str(row.get("late_note", "")))]


def exercise_columns(rows: list[dict]) -> list[tuple[str, str]]:
    """(lesson, exercise) of every exercise graded, lessons in order, exercises in the
    notebook's order."""
    seen: dict[tuple[str, str], None] = {}
    for row in sorted(rows, key=lambda r: str(r["lesson"])):
        for name in row.get("exercises") or {}:
            seen.setdefault((str(row["lesson"]), name), None)
    return list(seen)


def export_per_exercise(course: Course, path: Path) -> int:
    """One row per student, lesson and exercise: the score (after review), the grader's,
    whether it was set in review and why, and the checks that passed. Returns the rows
    written."""
    from grader.review import states

    rows = course.grades()
    statuses = course.statuses()
    decisions = states(course.db_url)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_NONNUMERIC)
        writer.writerow(["student_id", "lesson", "exercise", "score", "max_score",
                         "computed_score", "status", "overridden", "review_note",
                         "checks_passed", "checks_total"])
        for row in sorted(rows, key=lambda r: (str(r["lesson"]), str(r["student_id"]))):
            lesson, student = str(row["lesson"]), str(row["student_id"])
            ran = statuses.get(lesson, {}).get(student, {}).get("exercises", {})
            state = decisions.get((lesson, student))
            for name, result in (row.get("exercises") or {}).items():
                decision = state.overrides.get(name) if state else None
                checks = ran.get(name, {})
                writer.writerow([student_cell(student), lesson, name, float(result["score"]),
                                 float(result["max_score"]), float(result["computed"]),
                                 row["status"], "set" if decision else "",
                                 display(decision.note) if decision else "",
                                 checks.get("passed", ""), checks.get("total", "")])
                written += 1
    course.log(f"wrote {written} exercise grade(s) of {len(rows)} submission(s) to {path} "
               "(scores in raw points)")
    return written


def export(course: Course, path: Path, kind: str = "csv",
           roster_path: Path | list[Path] | None = None,
           assignments_path: Path | None = None, include_flagged: bool = False,
           lesson: str | None = None) -> int:
    """Write the grades to ``path`` as ``kind`` (of ``lesson`` alone where given); return the
    number of students written. ``roster_path``: one roster or several (merged)."""
    if kind not in KINDS:
        raise CourseError(f"unknown export format {kind!r}: {', '.join(KINDS)}")
    rows = course.grades()
    if lesson is not None:
        rows = [r for r in rows if r["lesson"] == lesson]
        if not rows:
            raise CourseError(f"no grades for {lesson} yet: run `python -m grader autograde "
                              f"{lesson} SUBMISSIONS` first")
    if isinstance(roster_path, Path):
        roster_path = [roster_path]
    if kind == "moodle-worksheet":
        from grader.lms_export import write_worksheet

        return write_worksheet(course, path, rows, roster_path or [], include_flagged)
    if kind == "moodle" and not roster_path:
        raise CourseError(
            "Moodle's grade import finds each student by a Moodle identifier (username, e-mail "
            "or ID number), and its download gives only participant ids, which are not one: "
            "give each lesson's grading worksheet (the assignment's View all submissions > "
            "Download grading worksheet) with --roster FILE, or export --format "
            "moodle-worksheet, which that worksheet takes back as it is")
    roster = read_rosters(roster_path) if roster_path else None
    assignments = read_assignments(assignments_path) if assignments_path else {}
    if kind == "canvas" and not assignments:
        raise CourseError(
            "Canvas matches a column to an assignment by 'Title (id)', then by its exact title, "
            "and makes a new assignment of any other: name each lesson's Canvas assignment in "
            "a file given with --assignments FILE, e.g.\n  lesson,title,id,points\n"
            "  01_float_formats,Float formats,4242,10\n(id: the number in the assignment's "
            "address; points: its points possible, to scale the scores to; both may be blank)")
    students = sorted({str(r["student_id"]) for r in rows})
    lessons = sorted({str(r["lesson"]) for r in rows})
    maxima = {str(r["lesson"]): float(r["max_score"]) for r in rows}
    if roster is not None:
        missing = sorted(set(roster) - set(students))
        for student in missing:
            for name in lessons:
                rows.append({"student_id": student, "lesson": name, "score": None,
                             "max_score": maxima[name], "status": "missing",
                             "reason": "on the roster, no submission"})
        if missing:
            course.log(f"{len(missing)} student(s) on the roster have no submission (left "
                       "out): " + inert(", ".join(missing), 500))
        unknown = sorted(set(students) - set(roster))
        if unknown:
            course.log(f"{len(unknown)} graded student(s) are not on the roster: "
                       + inert(", ".join(unknown), 500))
        students = sorted(set(students) | set(roster))
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind != "csv":
        from grader.lms_export import write_lms

        return write_lms(course, path, kind, rows, students, lessons, maxima, roster or {},
                         assignments, include_flagged)
    columns = exercise_columns(rows)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_NONNUMERIC)
        writer.writerow(["student_id", "lesson", "score", "max_score", "status", "reason",
                         "name", "late", "from", "lms_id", "computed_score", "review",
                         "review_note", "reviewed_by",
                         *(f"{lesson}/{name}" for lesson, name in columns), *LATE_COLUMNS])
        for row in sorted(rows, key=lambda r: (str(r["lesson"]), str(r["student_id"]))):
            score = "" if row["score"] is None else float(row["score"])
            computed = row.get("computed_score")
            per = row.get("exercises") or {}
            writer.writerow([student_cell(row["student_id"]), row["lesson"], score,
                             float(row["max_score"]), row["status"],
                             display(row.get("reason", "")), display(row.get("name", "")),
                             "late" if row.get("late") else "", row.get("from", ""),
                             display(row.get("lms_id", "")),
                             "" if computed is None else float(computed),
                             display(row.get("review", "")), display(row.get("review_note", "")),
                             display(row.get("reviewed_by", "")),
                             *(float(per[name]["score"]) if lesson == row["lesson"]
                               and name in per else "" for lesson, name in columns),
                             *late_cells(row)])
    course.log(f"wrote {len(students)} student(s), {len(lessons)} lesson(s) to {path} "
               "(scores in raw points)")
    return len(students)
