"""The instructor's files about students and assignments: rosters (an LMS's gradebook export,
Moodle's grading worksheet) and assignment lists, read as CSV."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from grader.common.errors import CourseError

ROSTER_COLUMNS = ("name", "lms_id", "sis_user_id", "sis_login_id", "section", "email",
                  "username", "id_number")


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
