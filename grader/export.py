"""``python -m grader export``: grades as a CSV of our own, or as an LMS's grade import file.

- ``csv``: one row per student and lesson: ``student_id, lesson, score, max_score, status,
  reason, name, late, from, lms_id`` (``lms_id``: the LMS's own id where it could not be the
  gradebook's), then ``computed_score, review, review_note, reviewed_by`` (the grader's own
  score and the review decisions in force: grader/review.py) and a column per exercise,
  ``LESSON/EXERCISE``, then the late policy's ``raw_score, late_penalty, final_score,
  submitted_at, time_source, due, late_note`` (grader/deadlines.py; ``score`` is the final
  score, after review and penalty, and so is what the LMS exports write).
  ``export_per_exercise``: one row per student, lesson and exercise.
- ``canvas``: Canvas's Gradebook import file (Canvas Instructor Guide, "How do I import grades
  in the Gradebook?"; the importer is ``app/models/gradebook_importer.rb``): the columns
  ``Student, ID, SIS User ID, SIS Login ID, Section``, then one column per lesson headed
  ``Title (id)`` as the instructor's assignments file names it (Canvas matches a column by
  that id, then by its exact title, and makes a new assignment of any other), a second row
  ``Points Possible`` where the assignments file gives every lesson's points, then a row per
  student.
- ``moodle``: a file for Moodle's "Import grades from CSV file" (``grade/import/csv``): one
  identifier column (``Username``, ``Email address`` or ``ID number``: the one the roster
  fills), ``Full name``, one column per lesson, each mapped to its grade item in the form.

What the importers would do with a careless file decides what is written:

- A blank cell means "no score" to both importers. Missing work, an ``invalid`` submission
  and a ``needs_review`` one are written blank and listed, never as 0 (which would overwrite a
  grade or an excusal entered by hand); ``include_flagged`` writes the computed scores of
  ``needs_review`` ones, once the instructor has looked. An ``invalid`` one has no computed
  score: it stays blank.
- A student the LMS knows under one identifier and the course under several (Moodle gives each
  assignment its own participant ids) is one row: cells of several lessons are merged.
- Only identifiers the LMS gave are written: from the download (Canvas's user id; Moodle's
  participant id is not a gradebook identifier) or from the roster. A student without one is
  listed for the instructor, never written with a guess: Canvas shows a guess as an unknown
  student, Moodle rejects the whole file for one unknown user, and a blank identifier can
  give a grade to the previous row's student.
- An identifier is written exactly as the LMS knows it. One that a spreadsheet would read as a
  formula (``= + - @`` first) is refused and listed; display fields (names, reasons) are
  quoted with a leading ``'`` instead.
- Scores are the lesson's raw points, unless the assignments file gives the LMS assignment's
  points possible: then each score is scaled to it.

The files beside the export: ``NAME-not-exported.csv`` lists every student and lesson left
blank or left out, and why.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from grader.course import Course
from grader.intake import inert, valid_student_id
from grader.lessons import CourseError

ROSTER_COLUMNS = ("name", "lms_id", "sis_user_id", "sis_login_id", "section", "email",
                  "username", "id_number")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")
MOODLE_IDS = {"username": "Username", "email": "Email address", "id_number": "ID number"}
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


def display(value: str) -> str:
    """A display field (a name, a reason) that no spreadsheet runs as a formula."""
    value = inert(value, limit=1000)
    return "'" + value if value.startswith(FORMULA_START) else value


def student_cell(student_id: str) -> str:
    """Our student id as written in our own files: as it is where it is a valid gradebook id
    (letters, digits and ._@+-: no formula can call anything), else quoted like a name (a
    folder's name that was refused as an id may hold anything)."""
    return student_id if valid_student_id(student_id) else display(student_id)


def unsafe_identifier(value: str) -> str:
    """Why an identifier cannot be written as it is, or ''."""
    if value.startswith(FORMULA_START):
        return f"its identifier {inert(value, 60)!r} would be read as a formula"
    if inert(value, 1000) != value:
        return "its identifier holds control characters"
    return ""


def points_text(value: float) -> str:
    """A score as the LMS reads it: at most two decimals, no trailing zeros."""
    return f"{round(value, 2):.2f}".rstrip("0").rstrip(".")


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
           assignments_path: Path | None = None, include_flagged: bool = False) -> int:
    """Write the grades to ``path`` as ``kind``; return the number of students written.
    ``roster_path``: one roster or several (merged)."""
    if kind not in ("csv", "canvas", "moodle"):
        raise CourseError(f"unknown export format {kind!r}: csv, canvas or moodle")
    rows = course.grades()
    if isinstance(roster_path, Path):
        roster_path = [roster_path]
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
            for lesson in lessons:
                rows.append({"student_id": student, "lesson": lesson, "score": None,
                             "max_score": maxima[lesson], "status": "missing",
                             "reason": "on the roster, no submission"})
        if missing:
            course.log(f"{len(missing)} student(s) on the roster have no submission (left "
                       "blank): " + inert(", ".join(missing), 500))
        unknown = sorted(set(students) - set(roster))
        if unknown:
            course.log(f"{len(unknown)} graded student(s) are not on the roster: "
                       + inert(", ".join(unknown), 500))
        students = sorted(set(students) | set(roster))
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "csv":
        columns = exercise_columns(rows)
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, quoting=csv.QUOTE_NONNUMERIC)
            writer.writerow(["student_id", "lesson", "score", "max_score", "status", "reason",
                             "name", "late", "from", "lms_id", "computed_score", "review",
                             "review_note", "reviewed_by",
                             *(f"{lesson}/{name}" for lesson, name in columns),
                             *LATE_COLUMNS])
            for row in sorted(rows, key=lambda r: (str(r["lesson"]), str(r["student_id"]))):
                score = "" if row["score"] is None else float(row["score"])
                computed = row.get("computed_score")
                per = row.get("exercises") or {}
                writer.writerow([student_cell(str(row["student_id"])), row["lesson"], score,
                                 float(row["max_score"]), row["status"],
                                 display(str(row.get("reason", ""))),
                                 display(str(row.get("name", ""))),
                                 "late" if row.get("late") else "", row.get("from", ""),
                                 display(str(row.get("lms_id", ""))),
                                 "" if computed is None else float(computed),
                                 display(str(row.get("review", ""))),
                                 display(str(row.get("review_note", ""))),
                                 display(str(row.get("reviewed_by", ""))),
                                 *(float(per[name]["score"]) if lesson == row["lesson"]
                                   and name in per else "" for lesson, name in columns),
                                 *late_cells(row)])
        course.log(f"wrote {len(students)} student(s), {len(lessons)} lesson(s) to {path} "
                   "(scores in raw points)")
        return len(students)
    return _write_lms(course, path, kind, rows, students, lessons, maxima, roster or {},
                      assignments, include_flagged)


def _write_lms(course: Course, path: Path, kind: str, rows: list[dict], students: list[str],
               lessons: list[str], maxima: dict[str, float], roster: dict[str, dict[str, str]],
               assignments: dict[str, Assignment], include_flagged: bool) -> int:
    by_cell = {(str(r["student_id"]), str(r["lesson"])): r for r in rows}
    held: list[list[str]] = []  # student, name, lesson, status, why
    if assignments:
        left_out = [x for x in lessons if x not in assignments]
        if left_out:
            course.log(f"not in the assignments file, so left out: {', '.join(left_out)}")
        unused = sorted(set(assignments) - set(lessons))
        if unused:
            course.log(f"no grades yet for {', '.join(unused)}: not written")
        lessons = [x for x in lessons if x in assignments]
    if not lessons:
        raise CourseError("no lesson to write: none of the graded lessons is in the "
                          "assignments file")
    columns = [assignments[x] if x in assignments else Assignment(x, x) for x in lessons]

    def cell(student: str, lesson: str, name: str) -> str:
        row = by_cell.get((student, lesson))
        status = row["status"] if row else "missing"
        if row is None or row["score"] is None or status == "missing":
            held.append([student, name, lesson, "missing", "no submission"])
            return ""
        if status == "invalid" or (status != "graded" and not include_flagged):
            held.append([student, name, lesson, status, str(row.get("reason", ""))])
            return ""
        score, possible = float(row["score"]), maxima[lesson]
        target = assignments.get(lesson)
        if target is not None and target.points is not None and possible > 0:
            score = score / possible * target.points
        return points_text(score)

    def known(student: str) -> dict[str, str]:
        found = dict(roster.get(student, {}))
        origin = course_origin.get(student, {})
        if origin.get("from") == "canvas" and not found.get("lms_id") \
                and not student.startswith("anon_"):
            found["lms_id"] = student  # the user id in Canvas's own download
        found["name"] = found.get("name") or origin.get("name", "")
        found["email"] = found.get("email") or origin.get("email", "")
        return found

    course_origin = {str(r["student_id"]): r for r in rows if r.get("from")}
    written = 0
    if kind == "canvas":
        id_fields = ("lms_id", "sis_user_id", "sis_login_id")
        matched = "ID, SIS User ID or SIS Login ID"
        header = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                  *(c.canvas_header for c in columns)]
        lines = [header]
        if all(c.points is not None for c in columns):  # else Canvas's own points stand
            lines.append(["Points Possible", "", "", "", "",
                          *(points_text(c.points) for c in columns)])
    else:
        counts = {f: sum(bool(known(s).get(f)) for s in students) for f in MOODLE_IDS}
        field = max(MOODLE_IDS, key=lambda f: counts[f])  # ties: the order of MOODLE_IDS
        id_fields, matched = (field,), MOODLE_IDS[field]
        lines = [[MOODLE_IDS[field], "Full name", *(c.title for c in columns)]]
    people: dict[tuple[str, ...], list[str]] = {}  # the LMS's identifiers -> our students
    for student in students:
        ids = known(student)
        name = ids.get("name", "")
        given = tuple(ids.get(f, "") for f in id_fields)
        problem = next((unsafe_identifier(v) for v in given if unsafe_identifier(v)), "")
        if not any(given) or problem:
            why = problem or (
                "anonymous grading: Canvas's download gives no user id; add it to the roster"
                if student.startswith("anon_") and kind == "canvas"
                else f"no identifier from the LMS ({matched}): add it to the roster")
            held += [[student, name, x, "not written", why] for x in lessons]
            continue
        people.setdefault(given, []).append(student)
    for given, ours in people.items():
        ids = known(ours[0])
        name = next((known(s)["name"] for s in ours if known(s).get("name")), "")
        cells = []
        for lesson in lessons:
            having = [s for s in ours if by_cell.get((s, lesson), {}).get("status", "missing")
                      != "missing"]
            if len(having) > 1:  # one person, two hand-ins of one lesson: the instructor decides
                held += [[s, name, lesson, "not written", "the LMS knows these as one student: "
                          + ", ".join(having)] for s in having]
                cells.append("")
            else:
                cells.append(cell(having[0] if having else ours[0], lesson, name))
        if kind == "canvas":
            lines.append([display(name or ours[0]), *given, display(ids.get("section", "")),
                          *cells])
        else:
            lines.append([*given, display(name), *cells])
        written += 1
    with path.open("w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows(lines)
    held_path = path.with_name(f"{path.stem}-not-exported.csv")
    with held_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_NONNUMERIC)
        writer.writerow(["student_id", "name", "lesson", "status", "why"])
        writer.writerows([[student_cell(row[0]), *(display(v) for v in row[1:])]
                          for row in held])
    scaled = [c.lesson for c in columns if c.points is not None]
    course.log(f"wrote {written} student(s), {len(columns)} lesson(s) to {path} ({kind}); "
               + (f"scores scaled to the LMS's points for {', '.join(scaled)}, raw points for "
                  "the rest" if scaled else "scores in raw points (give points in the "
                  "assignments file to scale them)"))
    if kind == "moodle":
        course.log(f"in Moodle's import form, map {matched!r} to the user field of that name")
    kinds = {}
    for row in held:
        kinds[row[3]] = kinds.get(row[3], 0) + 1
    if held:
        course.log(f"left blank or out: {', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}"
                   f" (listed in {held_path})"
                   + ("" if include_flagged else "; --include-flagged writes the computed scores"
                      " of needs_review submissions"))
    return written
