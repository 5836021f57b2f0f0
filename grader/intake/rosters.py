"""The instructor's files about students and assignments: rosters (an LMS's gradebook export,
Moodle's grading worksheet) and assignment lists, read as CSV."""

from __future__ import annotations

import csv
import io
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from grader.common.errors import CourseError
from grader.common.text import inert, valid_student_id
from grader.content.variants import canonical
from grader.intake import worksheet

ROSTER_COLUMNS = ("name", "lms_id", "sis_user_id", "sis_login_id", "section", "email",
                  "username", "id_number")


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


@dataclass(frozen=True)
class Person:
    """One student as a roster names them: the course id (the id the student works under and
    gives the lab: a hub user name, a login, an e-mail, as the instructor chose) and every id
    an LMS knows them by, as (kind, value): ``canvas`` (Canvas's user id), ``moodle:LESSON``
    (the participant id of that lesson's Moodle assignment), ``email``, ``username``,
    ``sis_user_id``, ``sis_login_id``, ``id_number``. ``where``: the file and line, for
    messages."""

    course_id: str
    name: str = ""
    email: str = ""
    ids: tuple[tuple[str, str], ...] = ()
    where: str = ""


# The kinds of id a roster may name as the course id (``roster --course-id``).
COURSE_ID_FIELDS = ("student_id", "email", "username", "sis_login_id", "sis_user_id",
                    "id_number", "lms_id")
GENERIC = ("email", "username", "sis_login_id", "sis_user_id", "id_number")


def read_csv(path: Path, what: str) -> list[dict[str, str]]:
    """The rows of a CSV as an LMS or a spreadsheet writes it (a BOM, commas, or semicolons
    where a spreadsheet saved it so), each a dict of its stripped cells. Refused, saying what is
    wrong: a file that is not UTF-8 text, a NUL character, a column named twice."""
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise CourseError(f"cannot read the {what} {path}: {error}") from None
    if "\x00" in text:
        raise CourseError(f"the {what} {path} holds a NUL character: it is no CSV as an LMS "
                          "writes one (save it again as CSV, UTF-8)")
    first = text.split("\n", 1)[0]
    delimiter = ";" if first.count(";") > first.count(",") else ","
    try:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
        header = [cell.strip() for cell in next(reader, [])]
        doubled = sorted({h for h in header if h and header.count(h) > 1})
        if doubled:
            raise CourseError(f"the {what} {path} names the column {doubled[0]!r} twice: keep "
                              "one of them")
        return [{key: (line[i] if i < len(line) else "").strip()
                 for i, key in enumerate(header)} for line in reader if any(line)]
    except csv.Error as error:
        raise CourseError(f"cannot read the {what} {path}: {error}") from None


def _fields(path: Path) -> tuple[str, list[dict[str, str]]]:
    """The roster's form (``ours``, ``canvas``, ``moodle``) and its rows, each with the
    fields of ROSTER_COLUMNS (a Moodle worksheet's ``participant`` too) and its line."""
    rows = read_csv(path, "roster")
    if not rows:
        raise CourseError(f"the roster {path} holds no student: give the file with its rows")
    header = list(rows[0])
    found = []
    if "student_id" in header:
        form = "ours"
        for line, row in enumerate(rows, start=2):
            if row.get("student_id"):
                found.append({"student_id": row["student_id"], "line": str(line),
                              **{k: row.get(k, "") for k in ROSTER_COLUMNS}})
    elif {"Student", "ID"} <= set(header):
        form = "canvas"
        for line, row in enumerate(rows, start=2):
            if row.get("ID", "").isdigit():  # not "Points Possible" nor a muted-assignment row
                found.append({
                    **dict.fromkeys(ROSTER_COLUMNS, ""), "line": str(line),
                    "name": row.get("Student", ""), "lms_id": row["ID"],
                    "sis_user_id": row.get("SIS User ID", ""),
                    "sis_login_id": row.get("SIS Login ID", row.get("Login ID", "")),
                    "section": row.get("Section", "")})
    elif worksheet.is_worksheet(header):
        form = "moodle"
        for line, row in enumerate(worksheet.english_rows(rows), start=2):
            number = worksheet.participant(row.get("Identifier", ""))
            if number:
                found.append({**dict.fromkeys(ROSTER_COLUMNS, ""), "line": str(line),
                              "participant": number, "name": row.get("Full name", ""),
                              "email": row.get("Email address", ""),
                              "id_number": row.get("ID number", ""),
                              "username": row.get("Username", ""),
                              "max_grade": row.get("Maximum Grade", "")})
    else:
        raise CourseError(
            f"the roster {path} needs a header row: a student_id column (and any of "
            f"{', '.join(ROSTER_COLUMNS)}), or Canvas's gradebook export (Student, ID, ...), or "
            "Moodle's grading worksheet (Identifier, Full name, Email address, ...)")
    return form, found


def _key_of(form: str, row: dict[str, str]) -> str:
    return row["student_id"] if form == "ours" else row["lms_id"] if form == "canvas" \
        else row["participant"]


def read_roster(path: Path) -> dict[str, dict[str, str]]:
    """student_id -> the LMS's identifiers for that student (for the exports). The roster is our
    own CSV (a ``student_id`` column and any of ROSTER_COLUMNS), Canvas's gradebook export
    (``Student, ID, SIS User ID, SIS Login ID, Section``) or Moodle's grading worksheet
    (``Identifier`` "Participant N", ``Full name``, ``Email address``, in any language
    grader/intake/worksheet.py reads), as the LMS wrote it. A student named twice in two ways,
    or an LMS id given to two students, is refused with the lines named: a guess would send a
    grade to the wrong account."""
    form, rows = _fields(path)
    roster: dict[str, dict[str, str]] = {}
    lines: dict[str, str] = {}
    for row in rows:
        key = _key_of(form, row)
        ids = {k: row.get(k, "") for k in ROSTER_COLUMNS}
        if row.get("max_grade"):  # a worksheet's: the points its assignment is out of
            ids["max_grade"] = row["max_grade"]
        if key in roster and roster[key] != ids:
            raise CourseError(f"the roster {path} names {inert(key, 60)!r} twice, in two ways "
                              f"(lines {lines[key]} and {row['line']}): keep the right row")
        roster[key], lines[key] = ids, row["line"]
    _one_owner(roster, {k: f"{path}, line {v}" for k, v in lines.items()})
    return roster


def _one_owner(roster: dict[str, dict[str, str]], where: dict[str, str],
               fields: tuple[str, ...] = ("lms_id", "sis_user_id", "sis_login_id", "email",
                                          "username", "id_number")) -> None:
    """Refuse an LMS id (Canvas's user id, a login, an e-mail) that two students hold."""
    for field in fields:
        owner: dict[str, str] = {}
        for student, ids in roster.items():
            value = ids.get(field, "")
            if not value:
                continue
            other = owner.setdefault(same_email(value) if field == "email" else value, student)
            if other != student:
                raise CourseError(
                    f"the roster gives {field} {inert(value, 60)!r} to two students, "
                    f"{inert(other, 60)!r} ({where.get(other, '')}) and {inert(student, 60)!r} "
                    f"({where.get(student, '')}): correct it (a grade would go to the wrong "
                    "account)")


def read_rosters(paths: list[Path]) -> dict[str, dict[str, str]]:
    """The rosters of ``paths`` as one: Moodle's grading worksheets of several assignments hold
    different participant ids, so they add up without clashing. A student that two files name
    in two ways is refused, with both files named."""
    merged: dict[str, dict[str, str]] = {}
    where: dict[str, str] = {}
    for path in paths:
        for student, ids in read_roster(path).items():
            known = merged.setdefault(student, dict(ids))
            clash = [k for k, v in ids.items() if v and known.get(k) and known[k] != v]
            if clash:
                raise CourseError(f"{inert(student, 60)!r} has another {clash[0]} in {path} "
                                  f"than in {where[student]}: correct one of them")
            for key, value in ids.items():
                known[key] = known.get(key) or value
            where.setdefault(student, str(path))
    # Across files, one person may stand under several keys (a Moodle participant id per
    # assignment, joined by e-mail): only Canvas's user id must be one student's.
    _one_owner(merged, where, ("lms_id",))
    return merged


MAX_ID_CHARS = 200  # an LMS id as stored (ctc_roster.value)


def read_people(path: Path, course_id: str | None = None,
                lesson: str | None = None) -> tuple[list[Person], list[str]]:
    """Each student of a roster file as a ``Person`` whose course id is the field
    ``course_id`` names (default: our CSV's ``student_id``, Canvas's SIS Login ID, Moodle's
    e-mail), and the rows left out: those with no course id (Canvas's "Test Student" has no
    SIS login), named. A Moodle worksheet's participant ids are its assignment's: ``lesson``
    says which. Refused, saying what to fix: a course id that cannot be one, an id with control
    characters or over 200 characters, and a course id or an LMS id named twice in two ways."""
    form, rows = _fields(path)
    if form == "moodle" and lesson is None:
        raise CourseError(f"{path} is a Moodle grading worksheet, whose participant ids are one "
                          "assignment's: say which lesson it is with --lesson LESSON")
    field = course_id or {"ours": "student_id", "canvas": "sis_login_id",
                          "moodle": "email"}[form]
    if field not in COURSE_ID_FIELDS or (field == "student_id" and form != "ours"):
        raise CourseError(f"--course-id {field!r}: one of "
                          f"{', '.join(f for f in COURSE_ID_FIELDS if f != 'student_id')}"
                          + (", student_id" if form == "ours" else "")
                          + f" (what {path} holds for each student)")
    people, seen, left_out = [], {}, []
    typed: dict[str, str] = {}  # each course id as its first row types it
    for row in rows:
        where = f"{path}, line {row['line']}"
        value = row.get(field, "")
        if not value:
            left_out.append(f"line {row['line']} "
                            f"({inert(row.get('name') or _key_of(form, row), 60)}): no {field}")
            continue
        bad = next((k for k in (*GENERIC, "lms_id", "participant") if len(row.get(k, ""))
                    > MAX_ID_CHARS or inert(row.get(k, ""), 1000) != row.get(k, "")), None)
        if bad is not None:
            raise CourseError(f"{where}: its {bad} {inert(row[bad], 60)!r} holds control "
                              f"characters or is longer than {MAX_ID_CHARS} characters: no LMS "
                              "writes such an id; correct the file")
        if not valid_student_id(value):
            raise CourseError(f"{where}: the course id {inert(value, 60)!r} ({field}) cannot be "
                              "a student id (letters, digits and ._@+-, at most 100)")
        ids = [(k, row[k]) for k in GENERIC if row.get(k)]
        if row.get("lms_id"):
            ids.append(("canvas", row["lms_id"]))
        if row.get("participant"):
            ids.append((f"moodle:{lesson}", row["participant"]))
        # the course id as the draw reads it (an e-mail in lower case), so that one person
        # typed two ways in two files (Moodle's "Anna.M@Uni.de", Canvas's "anna.m@uni.de") is
        # one student of the roster
        person = Person(canonical(value), inert(row.get("name", ""), 200),
                        row.get("email", ""), tuple(ids), where)
        # one person however the id is typed: an e-mail in any case (as the draw reads it) and
        # any Unicode form (NFC, NFD, NFKC); another id as it is
        same = same_email(value) if "@" in value else value
        if same in seen and (seen[same].ids != person.ids
                             or seen[same].course_id != person.course_id):
            earlier = seen[same]
            raise CourseError(f"{path} names the course id {inert(value, 60)!r} twice, in two "
                              f"ways (lines {earlier.where.rsplit(' ', 1)[-1]} and "
                              f"{row['line']}"
                              + (f", there as {inert(typed[same], 60)!r}"
                                 if typed[same] != value else "")
                              + "): keep the right row")
        if same not in seen:
            seen[same], typed[same] = person, value
            people.append(person)
    _one_owner({p.course_id: dict(p.ids) for p in people},
               {p.course_id: p.where for p in people}, ("email",))
    return people, left_out


def same_email(address: str) -> str:
    """An e-mail address as one person's, however it is typed: in any case and any Unicode
    form (NFKC, then case folding: "Müller" typed as u and a combining diaeresis, or in
    capitals, is one address)."""
    return unicodedata.normalize("NFKC", address.strip()).casefold()


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
