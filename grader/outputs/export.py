"""``python -m grader export``: grades as a CSV of our own, or as an LMS's grade import file.

- ``csv``: one row per student and lesson: ``student_id, lesson, score, max_score, status,
  reason, name, late, from, lms_id`` (``lms_id``: the LMS's own id where it could not be the
  gradebook's), then ``computed_score, review, review_note, reviewed_by`` (the grader's own
  score and the review decisions in force: grader/gradebook/review.py) and a column per exercise,
  ``LESSON/EXERCISE``, then the late policy's ``raw_score, late_penalty, final_score,
  submitted_at, time_source, due, late_note`` (grader/gradebook/deadlines.py; ``score`` is the final
  score, after review and penalty, and so is what the LMS exports write).
  ``export_per_exercise``: one row per student, lesson and exercise.
- ``canvas``, ``moodle``, ``moodle-worksheet``: the files each LMS's own grade import reads
  back (grader/outputs/lms_export.py): a file per lesson, a row per student with a score, never a
  blank cell (both importers read a blank as "remove the grade").

Every cell a student controls (an id, a name, a reason quoting a file name) is written so that
no spreadsheet runs it as a formula (grader/common/text.py).
"""

from __future__ import annotations

import csv
from pathlib import Path

from grader.common import files
from grader.common.errors import CourseError
from grader.common.text import display, inert, student_cell
from grader.gradebook.coursedir import CourseDir
from grader.intake.rosters import read_assignments, read_rosters
from grader.outputs.tables import Tables

KINDS = ("csv", "canvas", "moodle", "moodle-worksheet")


# Appended after the exercise columns (grader/gradebook/deadlines.py): the score review left, the
# points
# the late policy took, the final score (= score), and what the penalty was computed from.
LATE_COLUMNS = ("raw_score", "late_penalty", "final_score", "submitted_at", "time_source",
                "due", "late_note")


def course_id(row: dict) -> str:
    """The id a row's student works under across lessons (the roster's, the lab's): an LMS's
    own id for them is another per assignment under Moodle (its participant id), so only
    this one joins a person's lessons. Where the hand-in named none, the row's id as the draw
    reads it."""
    from grader.content.variants import canonical

    return canonical(str(row.get("course_id") or row["student_id"]))


def email_of(row: dict) -> str:
    """A row's e-mail: the hand-in's (Gradescope's, Canvas's roster), else its course id where
    that is one (Moodle's download gives none; its worksheet maps the student to it)."""
    found = str(row.get("email") or "")
    person = course_id(row)
    return found or (person if "@" in person else "")


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


def _remove_withdrawn(course: CourseDir, path: Path, kind: str, lessons: set[str],
                      dry_run: bool) -> None:
    """The LMS import file of each lesson whose grades are all gone (withdrawn): removed."""
    if kind == "csv":
        return
    from grader.outputs.lms_export import lesson_file, remove_stale

    for lesson in sorted(lessons):
        if lesson_file(path, lesson).is_file():
            remove_stale(course, path, lesson, dry_run, f"no grades left for {lesson}")


def export_per_person(course: CourseDir, path: Path) -> int:
    """One row per person across the course's lessons, for the instructor's own records:
    course id, name, e-mail, each lesson's score after review and late penalty (blank: no
    grade), the total and what it is out of. A person graded under several LMS ids (Moodle's
    participant ids, one per assignment) is one row, joined by the course id. Where one
    person has two grades of one lesson (handed in under two ids), the better counts and the
    row says so. Returns the people written."""
    rows = course.grades()
    lessons = sorted({str(r["lesson"]) for r in rows})
    maxima = {str(r["lesson"]): float(r["max_score"]) for r in rows}
    people: dict[str, dict] = {}
    for row in sorted(rows, key=lambda r: (str(r["lesson"]), str(r["student_id"]))):
        person = people.setdefault(course_id(row), {"name": "", "email": "", "scores": {},
                                                    "notes": []})
        person["name"] = person["name"] or str(row.get("name") or "")
        person["email"] = person["email"] or email_of(row)
        lesson = str(row["lesson"])
        score = None if row["score"] is None or row["status"] == "invalid" else float(
            row["score"])
        if lesson in person["scores"]:
            person["notes"].append(f"{lesson} graded twice (as {row['student_id']} too): "
                                   "the better counts")
            if score is None or (person["scores"][lesson] or 0.0) >= score:
                continue
        person["scores"][lesson] = score
    with files.written(path, newline="") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_NONNUMERIC)
        writer.writerow(["course_id", "name", "email", *lessons, "total", "out_of", "note"])
        for key in sorted(people):
            person = people[key]
            scores = [person["scores"].get(lesson) for lesson in lessons]
            writer.writerow([student_cell(key), display(person["name"]),
                             display(person["email"]),
                             *("" if s is None else s for s in scores),
                             sum(s for s in scores if s is not None),
                             sum(maxima.values()), display("; ".join(person["notes"]))])
    course.log(f"wrote {len(people)} person(s), {len(lessons)} lesson(s) to {path}: one row "
               "per person, joined by course id (scores in raw points, after review and late "
               "penalty)")
    return len(people)


def export_per_exercise(course: CourseDir, path: Path) -> int:
    """One row per student, lesson and exercise: the score (after review), the grader's,
    whether it was set in review and why, and the checks that passed. Returns the rows
    written."""
    from grader.gradebook.decisions import states

    rows = course.grades()
    statuses = course.statuses()
    decisions = states(course.db_url)
    written = 0
    with files.written(path, newline="") as handle:
        writer = csv.writer(handle, quoting=csv.QUOTE_NONNUMERIC)
        writer.writerow(["student_id", "lesson", "exercise", "score", "max_score",
                         "computed_score", "status", "overridden", "review_note",
                         "checks_passed", "checks_total", "course_id", "email"])
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
                                 checks.get("passed", ""), checks.get("total", ""),
                                 student_cell(course_id(row)), display(email_of(row))])
                written += 1
    course.log(f"wrote {written} exercise grade(s) of {len(rows)} submission(s) to {path} "
               "(scores in raw points)")
    return written


def command(course: CourseDir, args, lesson: str | None) -> int:
    """``python -m grader export``, as the command line's ``args`` ask."""
    if not args.dry_run and (args.csv is None or course.root in args.csv.resolve().parents):
        course.writable("export", "give --csv FILE to write elsewhere")
    if args.per_person:
        if args.format != "csv" or args.dry_run or args.per_exercise:
            raise CourseError("--per-person writes the csv format for your own records (an "
                              "LMS's import takes its own ids): leave out --format, --dry-run "
                              "and --per-exercise")
        export_per_person(course, args.csv or course.root / "grades-per-person.csv")
        return 0
    if args.per_exercise:
        if args.format != "csv" or args.dry_run:
            raise CourseError("--per-exercise writes the csv format (an LMS's import takes "
                              "one score per lesson), and no LMS reads it: leave out --format "
                              "and --dry-run, or drop --per-exercise")
        export_per_exercise(course, args.csv or course.root / "grades-per-exercise.csv")
        return 0
    suffix = "" if args.format == "csv" else f"-{args.format}"
    export(course, args.csv or course.root / f"grades{suffix}.csv", args.format, args.roster,
           args.assignments, args.include_flagged, lesson=lesson, dry_run=args.dry_run)
    return 0


def export(course: CourseDir, path: Path, kind: str = "csv",
           roster_path: Path | list[Path] | None = None,
           assignments_path: Path | None = None, include_flagged: bool = False,
           lesson: str | None = None, dry_run: bool = False) -> int:
    """Write the grades to ``path`` as ``kind`` (of ``lesson`` alone where given); return the
    number of students written. ``roster_path``: one roster or several (merged). With
    ``dry_run``, write nothing: say what each file would change against the one written
    last time (grader/outputs/tables.py)."""
    tables = Tables(course.log, dry_run)
    if kind not in KINDS:
        raise CourseError(f"unknown export format {kind!r}: {', '.join(KINDS)}")
    rows = course.grades()
    graded_lessons = {str(r["lesson"]) for r in rows}
    if lesson is not None:
        rows = [r for r in rows if r["lesson"] == lesson]
        if not rows:
            _remove_withdrawn(course, path, kind, {lesson}, dry_run)
            raise CourseError(f"no grades for {lesson}: none graded yet, or every one "
                              f"withdrawn (run `python -m grader autograde {lesson} "
                              "SUBMISSIONS`)")
    if isinstance(roster_path, Path):
        roster_path = [roster_path]
    if kind == "moodle-worksheet":
        from grader.outputs.lms_export import write_worksheet

        return write_worksheet(course, path, rows, roster_path or [], include_flagged, tables)
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
        # a student graded from another LMS's download (a course with lessons on Canvas and on
        # Moodle) is that LMS's, not a stranger to this roster
        elsewhere = {str(r["student_id"]) for r in rows
                     if r.get("from") in ("canvas", "moodle") and r.get("from") != kind}
        unknown = sorted(set(students) - set(roster) - elsewhere)
        if unknown:
            course.log(f"{len(unknown)} graded student(s) are not on the roster: "
                       + inert(", ".join(unknown), 500))
        students = sorted(set(students) | set(roster))
    if kind != "csv":
        from grader.content.lessons import all_lessons
        from grader.outputs.lms_export import write_lms

        gone = {x.name for x in all_lessons()} - graded_lessons
        if lesson is None:
            _remove_withdrawn(course, path, kind, gone, dry_run)
        return write_lms(course, path, kind, rows, students, lessons, maxima, roster or {},
                         assignments, include_flagged, tables)
    columns = exercise_columns(rows)
    lines: list[list] = [["student_id", "lesson", "score", "max_score", "status", "reason",
                          "name", "late", "from", "lms_id", "computed_score", "review",
                          "review_note", "reviewed_by",
                          *(f"{lesson}/{name}" for lesson, name in columns), *LATE_COLUMNS,
                          "course_id", "email"]]
    for row in sorted(rows, key=lambda r: (str(r["lesson"]), str(r["student_id"]))):
        score = "" if row["score"] is None else float(row["score"])
        computed = row.get("computed_score")
        per = row.get("exercises") or {}
        lines.append([student_cell(row["student_id"]), row["lesson"], score,
                      float(row["max_score"]), row["status"],
                      display(row.get("reason", "")), display(row.get("name", "")),
                      "late" if row.get("late") else "", row.get("from", ""),
                      display(row.get("lms_id", "")),
                      "" if computed is None else float(computed),
                      display(row.get("review", "")), display(row.get("review_note", "")),
                      display(row.get("reviewed_by", "")),
                      *(float(per[name]["score"]) if lesson == row["lesson"]
                        and name in per else "" for lesson, name in columns),
                      *late_cells(row), student_cell(course_id(row)),
                      display(email_of(row))])
    tables.write(path, lines, ("student_id", "lesson"), ("score", "status"), "name",
                 quoting=csv.QUOTE_NONNUMERIC)
    if not dry_run:
        course.log(f"wrote {len(students)} student(s), {len(lessons)} lesson(s) to {path} "
                   "(scores in raw points)")
    return len(students)
