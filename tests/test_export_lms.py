"""Grades and feedback back into each LMS, read by models of the LMS's own importers, and every
CSV we write neutral for a spreadsheet.

The models follow the importers' source: Canvas ``lib/gradebook_importer.rb`` (a blank cell is
a change to "no grade": it removes a score or an excusal entered by hand) and
``Assignment#infer_comment_context_from_filename`` (Re-Upload Submissions); Moodle
``grade/import/csv/classes/load_data.php`` (a blank grade is "no grade", an unknown user aborts
the whole import), ``mod/assign/feedback/offline/locallib.php`` ``process_import_grades`` (the
grading worksheet) and ``mod/assign/feedback/file/importziplib.php`` (feedback files). Each
test gives the LMS grades entered before the import, imports what we wrote, and checks that
nothing it should not touch changed. The classroom graded end to end is tests/test_handins.py.
"""

from __future__ import annotations

import copy
import csv
import io
import re
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from grader.common.errors import CourseError
from grader.common.text import FORMULA_START
from tests.grading_helpers import read_export

# ------------------------------------------------------------------ the importers, modelled

CANVAS_TITLE_ID = re.compile(r"\A(.*)\s\((\d+)\)\Z")  # lib/gradebook_importer.rb
CANVAS_IGNORED = re.compile(r"Current Score|Current Points|Current Grade|Final Score|"
                            r"Final Points|Final Grade|Override Score|Override Grade")


def canvas_import(text: str, assignments: dict[int, str], users: dict[str, dict[str, str]],
                  before: dict[str, dict[str, object]] | None = None):
    """What Canvas's gradebook importer makes of a file: the header must start ``Student``,
    ``ID`` and end the student columns with ``Section``; an assignment column is matched by
    ``Title (id)``'s id, then by its exact title, else it is a new assignment; a student by
    ID, then SIS User ID, then SIS Login ID, then name, else unknown. A cell's value replaces
    the grade Canvas holds, a blank one too (the grade, or an excusal ``EX``, is removed);
    students and assignments not in the file keep theirs. Returns (columns matched, new
    columns, {user id: {title: grade}} after the import, unknown rows)."""
    rows = list(csv.reader(io.StringIO(text)))
    header = rows[0]
    assert "Student" in header[0] and "ID" in header[1]
    section = header.index("Section")
    matched, new, unknown = {}, [], []
    grades = copy.deepcopy(before or {})
    for column, title in enumerate(header[section + 1:], start=section + 1):
        if CANVAS_IGNORED.search(title):
            continue
        found = CANVAS_TITLE_ID.match(title)
        if found and int(found[2]) in assignments:
            matched[column] = assignments[int(found[2])]
        elif title in assignments.values():
            matched[column] = title
        else:
            new.append(title)
    for row in rows[1:]:
        if "Points Possible" in row[0]:
            continue
        user = next((uid for uid, u in users.items() if row[1] and row[1] == uid), None) \
            or next((uid for uid, u in users.items() if row[2] and row[2] == u["sis_user_id"]),
                    None) \
            or next((uid for uid, u in users.items() if row[3] and row[3] == u["sis_login_id"]),
                    None) \
            or next((uid for uid, u in users.items() if row[0] == u["name"]), None)
        if user is None:
            unknown.append(row[:4])
            continue
        for c, title in matched.items():
            grades.setdefault(user, {})[title] = None if row[c] in ("", "-") else float(row[c])
    return matched, new, grades, unknown


def moodle_import(text: str, mapped: str, users: dict[str, dict[str, str]],
                  before: dict[str, dict[str, object]] | None = None):
    """Moodle's grade/import/csv load_data.php: the mapped column names the user (username,
    email or idnumber); an unknown user aborts the whole import; a blank identifier keeps the
    previous row's user (or aborts on the first row); a blank or ``-`` grade is imported as
    "no grade", erasing the one Moodle held. Returns {username: {column: grade}} after it."""
    rows = list(csv.reader(io.StringIO(text)))
    header, column = rows[0], rows[0].index(mapped)
    field = {"Username": "username", "Email address": "email", "ID number": "id_number"}[mapped]
    grades, student = copy.deepcopy(before or {}), None
    for row in rows[1:]:
        if row[column]:
            student = next((u for u, known in users.items() if known[field] == row[column]),
                           None)
            if student is None:
                raise AssertionError(f"User not found, abort whole import: {row[column]}")
        elif student is None:
            raise AssertionError("no user on the first row: import aborted")
        for i, title in enumerate(header):
            if i > 1:
                grades.setdefault(student, {})[title] = None if row[i] in ("", "-") \
                    else float(row[i])
    return grades


def moodle_worksheet_import(text: str, participants: dict[str, str],
                            before: dict[str, tuple[float | None, float]], maximum: float,
                            downloaded_at: float, feedback_columns=("Feedback comments",),
                            language: dict[str, str] | None = None):
    """Moodle's "Upload grading worksheet" (assignfeedback_offline: importgradeslib.php's
    ``init`` and ``next``, locallib.php's ``process_import_grades``): the columns
    ``Identifier``, ``Grade`` and ``Last modified (grade)`` must all be there, or nothing is
    imported; a row's participant is the number after "Participant "; its grade is skipped
    when blank, equal to Moodle's, out of 0..maximum, or when Moodle's grade changed after the
    worksheet's ``Last modified (grade)`` (which ``downloaded_at`` stands for here); a feedback
    column present is imported too. ``before``: user -> (grade, modified). ``language``: the
    uploading user's strings, recordid, gradenoun, lastmodifiedgrade and hiddenuser (English
    by default): the headings are matched exactly, and the identifier loses as many characters
    as hiddenuser has. Returns (user -> grade after, the feedback columns that would be
    imported)."""
    words = language or {"recordid": "Identifier", "gradenoun": "Grade",
                         "lastmodifiedgrade": "Last modified (grade)",
                         "hiddenuser": "Participant "}
    rows = list(csv.reader(io.StringIO(text)))
    header = rows[0]
    for needed in ("recordid", "gradenoun", "lastmodifiedgrade"):
        assert words[needed] in header, f"invalidgradeimport: no column {words[needed]}"
    grades = {user: grade for user, (grade, _) in before.items()}
    for row in rows[1:]:
        cells = dict(zip(header, row, strict=False))
        user = participants.get(cells[words["recordid"]][len(words["hiddenuser"]):])
        if user is None:
            continue
        value = cells[words["gradenoun"]].strip()
        current, modified = before.get(user, (None, 0.0))
        if value == "" or (current is not None and float(value) == current) \
                or not 0 <= float(value) <= maximum or modified > downloaded_at + 60:
            continue
        grades[user] = float(value)
    return grades, [c for c in header if c in feedback_columns]


def canvas_reupload(archive: Path, submissions: dict[str, list[str]]) -> dict[str, list[str]]:
    """Canvas's Re-Upload Submissions (``generate_comments_from_files``,
    ``infer_comment_context_from_filename``): each file's base name split at "_"; its first two
    all-digit parts are the user id and an attachment id, which must be one of that user's
    submitted files; "._" files and "link" files are ignored. Returns {user id: [files made
    comments]}; ``submissions``: user id -> their attachment ids."""
    comments: dict[str, list[str]] = {}
    with zipfile.ZipFile(archive) as handle:
        for member in handle.namelist():
            name = member.rsplit("/", 1)[-1]
            parts = name.split("_")
            user, attachment = ([p for p in parts if re.fullmatch(r"\d+", p)] + [None, None])[:2]
            if name.startswith("._") or parts[-1].startswith("link") or user is None \
                    or attachment not in submissions.get(user, []):
                continue
            comments.setdefault(user, []).append(name)
    return comments


def moodle_feedback_import(archive: Path) -> dict[str, list[str]]:
    """Moodle's importziplib.php: each path component split on "_" into at most five parts; the
    second is the participant id, the third and fourth the plugin (assignfeedback, file).
    Returns {participant id: [file names]}."""
    found: dict[str, list[str]] = {}
    with zipfile.ZipFile(archive) as handle:
        for name in handle.namelist():
            first, *rest = name.split("/")
            info = first.split("_", 4)
            assert len(info) >= 4 and info[1].isdigit(), name
            assert (info[2], info[3]) == ("assignfeedback", "file"), name
            found.setdefault(info[1], []).append("/".join([info[4], *rest]).lstrip("/"))
    return found


# ------------------------------------------------------------------ grades back

def fake_course(tmp_path, rows, statuses=None):
    from grader.course import Course

    course = Course(tmp_path / "course", log=lambda _: None)
    said: list[str] = []
    course.log = said.append
    course.grades = lambda: [copy.deepcopy(r) for r in rows]
    course.statuses = lambda lesson=None: copy.deepcopy(statuses or {})
    return course, said


def row(student, lesson, score, status="graded", source="", name="", reason="", maximum=15.0):
    return {"student_id": student, "lesson": lesson, "score": score, "max_score": maximum,
            "status": status, "reason": reason, "name": name, "late": False, "from": source,
            "email": "", "remarks": []}


ASSIGNMENTS = "lesson,title,id,points\n01_float_formats,Float formats,4242,10\n" \
              "04_backprop_flops,Backprop (6ND),4250,\n"
CANVAS_USERS = {"101": {"name": "Lovelace, Ada", "sis_user_id": "", "sis_login_id": ""},
                "102": {"name": "Smith, John", "sis_user_id": "", "sis_login_id": ""},
                "103": {"name": "Smith, Jo", "sis_user_id": "", "sis_login_id": ""},
                "104": {"name": "Cyd, Carl", "sis_user_id": "S4", "sis_login_id": "ccyd"}}
TITLES = {4242: "Float formats", 4250: "Backprop (6ND)"}


def test_canvas_gets_a_file_per_lesson_with_only_scores_so_no_grade_is_removed(tmp_path) -> None:
    """A blank cell in Canvas's import removes the grade Canvas holds (an ``EX`` too): a
    student with no score is left out of the lesson's file, never written blank."""
    from grader.outputs.export import export

    course, said = fake_course(tmp_path, [
        row("101", "01_float_formats", 12.0, source="canvas", name="lovelaceada"),
        row("102", "01_float_formats", 3.0, "needs_review", "canvas", "smithjohn", "=cmd|x"),
        row("103", "01_float_formats", 0.0, "invalid", "canvas", "=HYPERLINK(\"x\")"),
        row("103", "04_backprop_flops", 4.0, source="canvas", maximum=9.0),
        row("101", "04_backprop_flops", 7.5, source="canvas", maximum=9.0),
        row("s9", "01_float_formats", 15.0, source="folders"),  # no Canvas id known
        row("-5", "01_float_formats", 15.0, source="folders"),
    ])
    (tmp_path / "a.csv").write_text(ASSIGNMENTS)
    roster = tmp_path / "roster.csv"
    roster.write_text("student_id,name,lms_id,sis_user_id,sis_login_id,section\n"
                      "-5,Minus Five,=1+1,,,\n104,\"Cyd, Carl\",104,S4,ccyd,A\n")
    assert export(course, tmp_path / "canvas.csv", "canvas", roster, tmp_path / "a.csv") == 2
    before = {"102": {"Float formats": 9.0}, "103": {"Float formats": "EX"},
              "104": {"Float formats": "EX", "Backprop (6ND)": 5.0}}
    grades = before
    files = sorted(tmp_path.glob("canvas-0*.csv"))
    assert [f.name for f in files] == ["canvas-01_float_formats.csv",
                                       "canvas-04_backprop_flops.csv"]
    for path in files:
        matched, new, grades, unknown = canvas_import(path.read_text(), TITLES, CANVAS_USERS,
                                                      grades)
        assert new == [] and unknown == [] and len(matched) == 1
        table = list(csv.reader(io.StringIO(path.read_text())))
        assert table[0][:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
        assert all(cell != "" for line in table[1:] for cell in line[5:])  # no blank score
    assert grades == {"101": {"Float formats": 8.0, "Backprop (6ND)": 7.5},  # 12/15 of 10; raw
                      "102": {"Float formats": 9.0},  # needs_review: untouched
                      "103": {"Float formats": "EX", "Backprop (6ND)": 4.0},  # invalid: untouched
                      "104": {"Float formats": "EX", "Backprop (6ND)": 5.0}}  # no submission
    first = list(csv.reader(files[0].open()))
    assert first[0][5:] == ["Float formats (4242)"] and first[1][0] == "Points Possible"
    assert not any(r[0] == "Points Possible" for r in csv.reader(files[1].open()))  # no points
    held = {(r["student_id"], r["lesson"]): r for r in csv.DictReader(
        (tmp_path / "canvas-not-exported.csv").open())}
    assert held[("102", "01_float_formats")]["status"] == "needs_review"
    assert held[("102", "01_float_formats")]["why"] == "'=cmd|x"  # a reason, quoted
    assert held[("103", "01_float_formats")]["status"] == "invalid"
    assert "no identifier from the LMS" in held[("s9", "01_float_formats")]["why"]
    assert "formula" in held[("'-5", "01_float_formats")]["why"]  # our id, quoted
    assert held[("104", "01_float_formats")]["status"] == "missing"
    assert any("a file per lesson" in s and "raw points" in s for s in said)
    export(course, tmp_path / "flagged.csv", "canvas", None, tmp_path / "a.csv",
           include_flagged=True)
    _, _, grades, _ = canvas_import((tmp_path / "flagged-01_float_formats.csv").read_text(),
                                    TITLES, CANVAS_USERS, before)
    assert grades["102"]["Float formats"] == 2.0  # needs_review, computed: 3 of 15, of 10
    assert grades["103"]["Float formats"] == "EX"  # invalid has no computed score


def test_canvas_export_without_assignments_refuses_and_shows_the_file_to_write(tmp_path) -> None:
    from grader.outputs.export import export

    course, _ = fake_course(tmp_path, [row("101", "01_float_formats", 12.0, source="canvas")])
    with pytest.raises(CourseError, match=r"(?s)Title \(id\).*lesson,title,id,points"):
        export(course, tmp_path / "canvas.csv", "canvas")


def test_one_lesson_is_one_file_with_its_points_possible_row(tmp_path) -> None:
    from grader.outputs.export import export

    course, _ = fake_course(tmp_path, [row("101", "01_float_formats", 15.0, source="canvas"),
                                       row("101", "02_tensors_and_strides", 1.0,
                                           source="canvas")])
    (tmp_path / "a.csv").write_text("lesson,title,id,points\n01_float_formats,Floats,1,20\n"
                                    "02_tensors_and_strides,Strides,2,\n")
    export(course, tmp_path / "c.csv", "canvas", None, tmp_path / "a.csv",
           lesson="01_float_formats")
    table = list(csv.reader((tmp_path / "c-01_float_formats.csv").open()))
    assert table[0][5:] == ["Floats (1)"]
    assert table[1] == ["Points Possible", "", "", "", "", "20"] and table[2][-1] == "20"


def test_a_lessons_canvas_file_keeps_its_name_and_one_that_no_longer_holds_goes(
        tmp_path) -> None:
    """The documented command writes the same file name however many lessons have grades (it
    once wrote canvas.csv for one lesson and canvas-LESSON.csv from the second on, leaving
    last week's canvas.csv beside); a lesson left with no score to write takes its file with
    it. Canvas's download gives a squashed sortable name ("lovelaceada"), not a name: the file
    shows the id Canvas matches by."""
    from grader.outputs.export import export

    (tmp_path / "a.csv").write_text(ASSIGNMENTS)
    one = [row("101", "01_float_formats", 12.0, source="canvas", name="lovelaceada")]
    course, _ = fake_course(tmp_path, one)
    export(course, tmp_path / "canvas.csv", "canvas", None, tmp_path / "a.csv")
    first = tmp_path / "canvas-01_float_formats.csv"
    assert sorted(p.name for p in tmp_path.glob("canvas*.csv")) == [
        first.name, "canvas-not-exported.csv"]
    table = list(csv.reader(first.open()))
    assert table[2][:2] == ["101", "101"] and "lovelaceada" not in first.read_text()
    two = [*one, row("101", "04_backprop_flops", 7.0, source="canvas", maximum=9.0)]
    course, _ = fake_course(tmp_path, two)
    export(course, tmp_path / "canvas.csv", "canvas", None, tmp_path / "a.csv")
    assert sorted(p.name for p in tmp_path.glob("canvas*.csv")) == [
        first.name, "canvas-04_backprop_flops.csv", "canvas-not-exported.csv"]
    flagged = [{**one[0], "status": "needs_review"}, two[1]]
    course, said = fake_course(tmp_path, flagged)
    export(course, tmp_path / "canvas.csv", "canvas", None, tmp_path / "a.csv")
    assert not first.exists() and any(f"removed {first}" in line for line in said)


def test_a_dry_run_shows_each_grade_the_lms_would_change_and_writes_nothing(tmp_path) -> None:
    from grader.outputs.export import export

    (tmp_path / "a.csv").write_text(ASSIGNMENTS)
    roster = tmp_path / "roster.csv"
    roster.write_text("student_id,name,lms_id\n101,Ada Lovelace,101\n102,Jean Dupont,102\n"
                      "103,Rick Roe,103\n")
    course, said = fake_course(tmp_path, [
        row("101", "01_float_formats", 12.0, source="canvas"),
        row("102", "01_float_formats", 15.0, source="canvas"),
        row("103", "01_float_formats", 6.0, source="canvas")])
    export(course, tmp_path / "c.csv", "canvas", roster, tmp_path / "a.csv", dry_run=True)
    assert said[-1] == f"dry run: {tmp_path / 'c-01_float_formats.csv'} does not exist yet: " \
        "4 row(s) would be new"  # three students and the Points Possible row
    assert list(tmp_path.glob("c-*.csv")) == []
    export(course, tmp_path / "c.csv", "canvas", roster, tmp_path / "a.csv")
    written = (tmp_path / "c-01_float_formats.csv").read_bytes()
    course, said = fake_course(tmp_path, [
        row("101", "01_float_formats", 15.0, source="canvas"),  # set in review: 8 -> 10
        row("102", "01_float_formats", 15.0, source="canvas"),
        row("103", "01_float_formats", 6.0, "needs_review", source="canvas"),  # regraded
        row("104", "01_float_formats", 3.0, source="canvas")])  # a late hand-in
    roster.write_text(roster.read_text() + "104,Eve Late,104\n")
    export(course, tmp_path / "c.csv", "canvas", roster, tmp_path / "a.csv", dry_run=True)
    shown = "\n".join(said)
    assert re.search(r"against the file written \S+ \S+ UTC: 1 changed, 1 new, 1 no longer "
                     r"written, 2 the same \(nothing was written\)", shown), shown
    assert "  101 (Ada Lovelace): 8 -> 10" in shown
    assert "  104 (Eve Late): new: 2" in shown
    assert "  103 (Rick Roe): 4 -> not written now (the LMS keeps what it has)" in shown
    assert (tmp_path / "c-01_float_formats.csv").read_bytes() == written


def moodle_people():
    return {"ada": {"email": "ada@uni.fr", "username": "ada", "id_number": ""},
            "jean": {"email": "jean@uni.fr", "username": "jean", "id_number": ""},
            "jean2": {"email": "jean2@uni.fr", "username": "jean2", "id_number": ""}}


def test_moodle_export_writes_one_identifier_the_roster_gives_and_erases_no_grade(
        tmp_path) -> None:
    from grader.outputs.export import export

    course, said = fake_course(tmp_path, [
        row("5001", "01_float_formats", 15.0, source="moodle", name="Adélaïde Lovelace"),
        row("5002", "01_float_formats", 6.0, source="moodle", name="Jean Dupont"),
        row("5003", "01_float_formats", 6.0, source="moodle", name="Jean Dupont"),
        row("5004", "01_float_formats", 1.0, "needs_review", "moodle", "Jo"),
    ])
    worksheet = tmp_path / "worksheet.csv"  # Moodle's "Download grading worksheet"
    worksheet.write_text("Identifier,Full name,Email address,Status,Grade,Maximum Grade\n"
                         "Participant 5001,Adélaïde Lovelace,ada@uni.fr,Submitted,,100\n"
                         "Participant 5002,Jean Dupont,jean@uni.fr,Submitted,,100\n"
                         "Participant 5004,Jo,jean2@uni.fr,Submitted,,100\n")
    export(course, tmp_path / "moodle.csv", "moodle", worksheet)
    text = (tmp_path / "moodle-01_float_formats.csv").read_text()
    assert next(csv.reader(io.StringIO(text))) == ["Email address", "Full name",
                                                   "01_float_formats"]
    grades = moodle_import(text, "Email address", moodle_people(),
                           {"jean2": {"01_float_formats": 4.0}})
    assert grades == {"ada": {"01_float_formats": 100.0},  # scaled to its Maximum Grade
                      "jean": {"01_float_formats": 40.0},
                      "jean2": {"01_float_formats": 4.0}}  # flagged: not erased
    held = list(csv.DictReader((tmp_path / "moodle-not-exported.csv").open()))
    assert sorted((r["student_id"], r["status"]) for r in held) == [
        ("5003", "not written"), ("5004", "needs_review")]
    assert any("map 'Email address'" in s for s in said)


def test_moodle_worksheets_of_two_lessons_make_one_row_per_person_in_a_file_per_lesson(
        tmp_path) -> None:
    """Moodle gives each assignment its own participant ids: Ada is 11 in lesson 01 and 57 in
    lesson 02. Her two worksheets' e-mail names her in both files."""
    from grader.outputs.export import export

    course, _ = fake_course(tmp_path, [
        row("11", "01_float_formats", 15.0, source="moodle", name="Ada"),
        row("57", "02_tensors_and_strides", 6.0, source="moodle", name="Ada", maximum=9.0),
        row("12", "01_float_formats", 3.0, source="moodle", name="Jean")])
    first, second = tmp_path / "w1.csv", tmp_path / "w2.csv"
    first.write_text("Identifier,Full name,Email address\nParticipant 11,Ada,ada@uni.fr\n"
                     "Participant 12,Jean,jean@uni.fr\n")
    second.write_text("Identifier,Full name,Email address\nParticipant 57,Ada,ada@uni.fr\n")
    assert export(course, tmp_path / "m.csv", "moodle", [first, second]) == 2
    grades = {"jean": {"02_tensors_and_strides": 5.0}}
    for path in sorted(tmp_path.glob("m-0*.csv")):
        grades = moodle_import(path.read_text(), "Email address", moodle_people(), grades)
    assert grades == {"ada": {"01_float_formats": 15.0, "02_tensors_and_strides": 6.0},
                      "jean": {"01_float_formats": 3.0, "02_tensors_and_strides": 5.0}}


def test_the_instructors_records_have_one_row_per_person_across_lessons(tmp_path) -> None:
    """Moodle gives Ada a participant id per assignment (11, then 57): grades.csv names her
    course id (her e-mail, as the roster mapped it) in both rows, and ``--per-person`` makes
    one row of her: course id, name, e-mail, each lesson's score, the total. A lesson she has
    no grade of is blank; an e-mail typed in another case is one person; one graded twice in a
    lesson (handed in under two ids) counts the better and says so."""
    from grader.outputs.export import export, export_per_person

    def person(student, lesson, score, course_id, maximum=15.0, **more):
        return {**row(student, lesson, score, source="moodle", name=more.pop("name", "Ada"),
                      maximum=maximum), "course_id": course_id, "email": course_id, **more}

    course, said = fake_course(tmp_path, [
        person("11", "01_float_formats", 15.0, "ada@uni.fr"),
        person("57", "02_tensors_and_strides", 6.0, "Ada@Uni.fr", maximum=9.0),
        person("12", "01_float_formats", 3.0, "jean@uni.fr", name="Jean"),
        person("jean", "01_float_formats", 5.0, "", name="Jean", source="folders"),
        person("13", "02_tensors_and_strides", 4.0, "noor@uni.fr", maximum=9.0, name="Noor")])
    export(course, tmp_path / "grades.csv")
    with (tmp_path / "grades.csv").open() as handle:
        ids = {(r["student_id"], r["lesson"]): r["course_id"] for r in csv.DictReader(handle)}
    assert ids[("11", "01_float_formats")] == ids[("57", "02_tensors_and_strides")] == \
        "ada@uni.fr"
    assert export_per_person(course, tmp_path / "people.csv") == 4
    with (tmp_path / "people.csv").open() as handle:
        people = {r["course_id"]: r for r in csv.DictReader(handle)}
    ada = people["ada@uni.fr"]
    assert (ada["name"], ada["01_float_formats"], ada["02_tensors_and_strides"],
            ada["total"], ada["out_of"]) == ("Ada", "15.0", "6.0", "21.0", "24.0")
    assert people["noor@uni.fr"]["01_float_formats"] == ""  # no grade: blank, not 0
    assert people["jean@uni.fr"]["01_float_formats"] == "3.0"  # one person, one row
    assert people["jean"]["01_float_formats"] == "5.0"  # another id, not mapped: its own row
    assert any("one row per person" in line for line in said)
    twice, _ = fake_course(tmp_path, [person("11", "01_float_formats", 9.0, "ada@uni.fr"),
                                      person("ada", "01_float_formats", 12.0, "ada@uni.fr")])
    export_per_person(twice, tmp_path / "twice.csv")
    with (tmp_path / "twice.csv").open() as handle:
        [only] = list(csv.DictReader(handle))
    assert only["01_float_formats"] == "12.0" and "graded twice" in only["note"]


def test_a_moodle_export_without_what_moodle_needs_says_why_and_fails(tmp_path) -> None:
    from grader.outputs.export import export
    from tests.test_review import command

    course, _ = fake_course(tmp_path, [row("5001", "01_float_formats", 15.0, source="moodle")])
    with pytest.raises(CourseError, match="grading worksheet"):
        export(course, tmp_path / "m.csv", "moodle")
    worksheet = tmp_path / "w.csv"  # a worksheet, but every student flagged
    worksheet.write_text("Identifier,Full name,Email address\nParticipant 5001,Ada,ada@x.fr\n")
    flagged, _ = fake_course(tmp_path, [row("5001", "01_float_formats", 15.0, "needs_review",
                                            "moodle", reason="graded x in place of y")])
    with pytest.raises(CourseError, match=r"nothing written.*1 needs_review.*--include-flagged"):
        export(flagged, tmp_path / "m.csv", "moodle", worksheet)
    done = command("export", "--format", "moodle", "--course-dir", tmp_path / "empty",
                   check=False)
    assert done.returncode == 2 and "grading worksheet" in done.stderr


WORKSHEET = ("Identifier,Full name,Email address,Status,Grade,Maximum Grade,Grade can be "
             "changed,Last modified (submission),Online text,Last modified (grade),Feedback "
             "comments\n"
             "Participant 5001,Adélaïde Lovelace,ada@uni.fr,Submitted for grading,,100.00,Yes,"
             "\"Monday, 10 March 2025, 11:58 PM\",\"=HYPERLINK(\"\"x\"\")\",-,\n"
             "Participant 5002,=cmd|' /C calc'!A0,jean@uni.fr,Submitted for grading,40.00,"
             "100.00,Yes,\"Monday, 10 March 2025, 9:00 PM\",,\"Tuesday, 11 March 2025, "
             "10:00 AM\",Well done\n"
             "Participant 5003,Rick Roe,rick@uni.fr,No submission,,100.00,Yes,-,,-,\n"
             "Participant 5004,Locked Out,lo@uni.fr,Submitted for grading,,100.00,No,"
             "\"Monday, 10 March 2025, 9:00 PM\",,-,\n")


def test_moodles_grading_worksheet_comes_back_filled_for_the_assignments_own_upload(
        tmp_path) -> None:
    from grader.outputs.export import export

    course, said = fake_course(tmp_path, [
        row("5001", "01_float_formats", 12.0, source="moodle"),
        row("5002", "01_float_formats", 15.0, source="moodle"),
        row("5004", "01_float_formats", 15.0, source="moodle"),
        row("5009", "01_float_formats", 3.0, source="moodle"),
        row("5001", "02_tensors_and_strides", 1.0, source="moodle")])
    worksheet = tmp_path / "Grades-CS101-Floats-77.csv"
    worksheet.write_text("\ufeff" + WORKSHEET, encoding="utf-8")
    with pytest.raises(CourseError, match="--lesson LESSON"):
        export(course, tmp_path / "filled.csv", "moodle-worksheet", worksheet)
    assert export(course, tmp_path / "filled.csv", "moodle-worksheet", worksheet,
                  lesson="01_float_formats") == 2
    text = (tmp_path / "filled.csv").read_text()
    people = {"5001": "ada", "5002": "jean", "5003": "rick", "5004": "lo"}
    downloaded = 1_741_600_000.0
    grades, feedback = moodle_worksheet_import(
        text, people, {"jean": (40.0, downloaded - 3600), "rick": (55.0, downloaded - 3600)},
        maximum=100.0, downloaded_at=downloaded)
    assert grades == {"ada": 80.0, "jean": 100.0, "rick": 55.0}  # scaled to its maximum
    assert feedback == []  # "Well done" and its column are not sent back to be re-imported
    table = list(csv.DictReader(io.StringIO(text)))
    assert [r["Identifier"] for r in table] == ["Participant 5001", "Participant 5002"]
    assert table[1]["Full name"].startswith("'=")  # a student's name, quoted
    assert table[1]["Last modified (grade)"] == "Tuesday, 11 March 2025, 10:00 AM"  # as it was
    assert "Online text" not in table[0]
    held = {r["student_id"]: r for r in csv.DictReader(
        (tmp_path / "filled-not-exported.csv").open())}
    assert held["5003"]["status"] == "missing" and "locks" in held["5004"]["why"]
    assert "not in the worksheet" in held["5009"]["why"]
    assert any("Upload grading worksheet" in s for s in said)
    (tmp_path / "french.csv").write_text("Identifiant,Nom complet,Note\n")
    with pytest.raises(CourseError, match="it lacks Maximum Grade, Last modified \\(grade\\)"):
        export(course, tmp_path / "x.csv", "moodle-worksheet", tmp_path / "french.csv",
               lesson="01_float_formats")


GERMAN = {"recordid": "ID", "gradenoun": "Bewertung",
          "lastmodifiedgrade": "Zuletzt geändert (Bewertung)", "hiddenuser": "Teilnehmer/in"}


def test_a_german_worksheet_comes_back_filled_under_its_own_headings(tmp_path) -> None:
    """Downloaded with Moodle in German (its AMOS strings: "Teilnehmer/in5001", "Bestwertung",
    a locked grade's "Nein"), filled in and written back under the same headings, which
    Moodle's upload in German matches exactly."""
    from grader.outputs.export import export

    course, _ = fake_course(tmp_path, [row("5001", "01_float_formats", 12.0, source="moodle"),
                                       row("5004", "01_float_formats", 15.0, source="moodle")])
    worksheet = tmp_path / "Bewertungen.csv"
    worksheet.write_text(
        "ID,Vollständiger Name,E-Mail-Adresse,Status,Bewertung,Bestwertung,Bewertung kann "
        "geändert werden,Zuletzt geändert (Abgabe),Zuletzt geändert (Bewertung),Feedback als "
        "Kommentar\n"
        "Teilnehmer/in5001,Ada L,ada@uni.fr,Abgegeben,,\"50,00\",Ja,\"Montag, 10. März 2025, "
        "23:58\",-,\n"
        "Teilnehmer/in5004,Lo C,lo@uni.fr,Abgegeben,,\"50,00\",Nein,-,-,\n", encoding="utf-8")
    assert export(course, tmp_path / "filled.csv", "moodle-worksheet", worksheet,
                  lesson="01_float_formats") == 1
    text = (tmp_path / "filled.csv").read_text()
    assert next(csv.reader(io.StringIO(text)))[:6] == [
        "ID", "Vollständiger Name", "E-Mail-Adresse", "Status", "Bewertung", "Bestwertung"]
    grades, feedback = moodle_worksheet_import(text, {"5001": "ada", "5004": "lo"}, {},
                                               maximum=50.0, downloaded_at=0.0,
                                               feedback_columns=("Feedback als Kommentar",),
                                               language=GERMAN)
    assert grades == {"ada": 40.0} and feedback == []  # 12 of 15, scaled to its 50; 5004 locked
    held = {r["student_id"]: r for r in csv.DictReader(
        (tmp_path / "filled-not-exported.csv").open())}
    assert "locks" in held["5004"]["why"]


def test_the_gradebook_import_scales_to_the_worksheets_maximum_or_refuses_a_disagreement(
        tmp_path) -> None:
    """A worksheet given as roster says what its assignment is out of: a perfect score imports
    as its Maximum Grade (100), and an assignments file that says otherwise (10) is refused,
    never silently used (a perfect score would import as 10%)."""
    from grader.outputs.export import export

    course, _ = fake_course(tmp_path, [row("5001", "01_float_formats", 15.0, source="moodle")])
    worksheet = tmp_path / "w.csv"
    worksheet.write_text("Identifier,Full name,Email address,Status,Grade,Maximum Grade\n"
                         "Participant 5001,Ada,ada@uni.fr,Submitted,,100.00\n")
    export(course, tmp_path / "m.csv", "moodle", worksheet)
    imported = (tmp_path / "m-01_float_formats.csv").read_text()  # a file per lesson
    grades = moodle_import(imported, "Email address", moodle_people(), {})
    assert grades == {"ada": {"01_float_formats": 100.0}}
    assignments = tmp_path / "a.csv"
    assignments.write_text("lesson,title,id,points\n01_float_formats,Floats,,10\n")
    with pytest.raises(CourseError, match=r"assignments file says 10 points, the Moodle "
                                          r"worksheet's Maximum Grade says 100"):
        export(course, tmp_path / "m2.csv", "moodle", worksheet, assignments)
    assignments.write_text("lesson,title,id,points\n01_float_formats,Floats,,100\n")
    export(course, tmp_path / "m3.csv", "moodle", worksheet, assignments)  # they agree


def test_anonymous_canvas_ids_are_not_written_as_user_ids(tmp_path) -> None:
    from grader.outputs.export import export

    course, _ = fake_course(tmp_path, [
        row("anon_x1Y2z", "01_float_formats", 15.0, source="canvas"),
        row("101", "01_float_formats", 15.0, source="canvas", name="lovelaceada")])
    (tmp_path / "a.csv").write_text(ASSIGNMENTS)
    export(course, tmp_path / "c.csv", "canvas", None, tmp_path / "a.csv")
    assert "anon_" not in (tmp_path / "c-01_float_formats.csv").read_text()
    held = (tmp_path / "c-not-exported.csv").read_text()
    assert "anon_x1Y2z" in held and "anonymous grading" in held


def test_canvas_takes_the_feedback_pages_back_through_re_upload_submissions(tmp_path) -> None:
    from grader.outputs.lms_export import canvas_reupload_zip

    page = tmp_path / "float_formats.html"
    page.write_text("<p>feedback</p>")
    pages = [("101", page, {"download_name": "lovelaceada_LATE_101", "file_id": "905"}),
             ("102", page, {"download_name": "smithjohn_102", "file_id": ""}),  # text entry
             ("anon_x1Y2z", page, {"download_name": "anon_x1Y2z", "file_id": "907"}),
             ("123", page, {"download_name": "alex_2005_123", "file_id": "77"}),
             ("124", page, {"download_name": "../evil_124", "file_id": "78"})]
    skipped = canvas_reupload_zip(tmp_path / "re-upload.zip", pages)
    assert canvas_reupload(tmp_path / "re-upload.zip", {"101": ["905"], "102": [],
                                                        "123": ["77"], "2005": []}) == {
        "101": ["lovelaceada_LATE_101_905_float_formats.html"]}
    assert [s.split(":")[0] for s in skipped] == ["102", "anon_x1Y2z", "123", "124"]
    assert "another user's" in skipped[2] and "text or URL" in skipped[0]


def test_the_plain_export_keeps_identifiers_and_shows_the_late_mark(tmp_path) -> None:
    from grader.outputs.export import export

    late = row("s1", "01_float_formats", 4.0, source="blackboard", name="@Bob")
    late["late"] = True
    course, _ = fake_course(tmp_path, [late])
    export(course, tmp_path / "plain.csv", "csv")
    found = read_export(tmp_path / "plain.csv")[("s1", "01_float_formats")]
    assert found["late"] == "late" and found["name"] == "'@Bob" and found["from"] == "blackboard"


# Ids a gradebook takes (letters, digits and ._@+-) that a spreadsheet reads as a formula, and
# names and reasons that hold anything.
FORMULA_IDS = st.sampled_from(["+1", "-2+3", "@SUM", "-5", "+cmd", "@x.y", "s1"]) | st.text(
    st.sampled_from("+-@.ab1"), min_size=1, max_size=8).filter(lambda s: not s.startswith("."))
TEXTS = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20) | st.sampled_from(
    ["=1+1", "\t=1+1", "\r=cmd", "\n@x", "+x", "-y", " =ok"])


def every_cell(path: Path) -> list[str]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [cell for line in csv.reader(handle) for cell in line]


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(student=FORMULA_IDS, name=TEXTS, reason=TEXTS)
@example(student="+1", name="=HYPERLINK(\"x\")", reason="\t=cmd")
@example(student="@x", name="\r=1", reason="-2")
def test_every_csv_we_write_is_neutral_in_every_student_controlled_cell(
        tmp_path_factory, student, name, reason) -> None:
    """grades.csv, the per-exercise export, the LMS files and what they left out, and the
    report's files: no cell starts a formula, whatever the id, name or reason (OWASP's CSV
    injection: = + - @, and tab or carriage return before one)."""
    from grader.content.lessons import load_lesson
    from grader.outputs.export import export, export_per_exercise
    from grader.outputs.report import report

    tmp = tmp_path_factory.mktemp("neutral")
    lesson = load_lesson("01_float_formats")
    graded = {**row(student, lesson.name, 4.0, "needs_review", "canvas", name, reason),
              "computed_score": 4.0, "computed_status": "needs_review", "review": "",
              "review_note": reason, "reviewed_by": "", "raw_score": 4.0,
              "late_penalty": 0.0, "time_source": reason, "late_note": reason,
              "submitted_at": "", "due": "",
              "exercises": {"decode": {"score": 4.0, "computed": 4.0, "max_score": 5.0}},
              "remarks": [reason]}
    other = {**graded, "student_id": "101", "status": "graded", "computed_status": "graded"}
    course, _ = fake_course(tmp, [graded, other], {lesson.name: {student: {
        "status": "needs_review", "reason": reason, "exercises": {"decode": {
            "points": 4.0, "max_points": 5.0, "passed": 1, "total": 2,
            "failures": [f"{reason}: failed"], "hidden_failed": False}}}}})
    course.deadlines = lambda: None
    (tmp / "a.csv").write_text("lesson,title,id,points\n01_float_formats,Floats,1,\n")
    written = [tmp / "g.csv", tmp / "e.csv", tmp / "c-01_float_formats.csv",
               tmp / "c-not-exported.csv"]
    export(course, written[0], "csv")
    export_per_exercise(course, written[1])
    export(course, tmp / "c.csv", "canvas", None, tmp / "a.csv", include_flagged=False)
    folder = report(course, lesson)
    written += sorted(folder.glob("*.csv"))
    for path in written:
        for cell in every_cell(path):
            assert not cell.startswith(FORMULA_START), (path.name, cell)
    quoted = "'" + student if student.startswith(FORMULA_START) else student
    assert (quoted, lesson.name) in read_export(written[0])  # the id, quoted where need be


def test_assignments_and_rosters_that_are_wrong_say_what_to_fix(tmp_path) -> None:
    from grader.intake.rosters import read_assignments, read_roster

    bad = tmp_path / "a.csv"
    for text, message in [("lesson,name\n", "needs a header row lesson,title"),
                          ("lesson,title,id\n01_float_formats,,1\n", "has no title"),
                          ("lesson,title,id\n01_float_formats,X,abc\n", "is not the LMS's number"),
                          ("lesson,title,points\n01_float_formats,X,-3\n", "not a positive")]:
        bad.write_text(text)
        with pytest.raises(CourseError, match=message):
            read_assignments(bad)
    bad.write_text("who,what\nx,y\n")
    with pytest.raises(CourseError, match=r"student_id column.*Canvas.*Moodle"):
        read_roster(bad)
    bad.write_text("Student,ID,SIS User ID,SIS Login ID,Section,Float formats (4242)\n"
                   "    Points Possible,,,,,10\n\"Lovelace, Ada\",101,S1,ada,A,\n")
    assert read_roster(bad) == {"101": {
        "name": "Lovelace, Ada", "lms_id": "101", "sis_user_id": "S1", "sis_login_id": "ada",
        "section": "A", "email": "", "username": "", "id_number": ""}}


def test_a_course_on_two_lmss_holds_back_only_what_had_a_score_to_write(tmp_path) -> None:
    """Lesson 01 from Moodle (participant 1201), lesson 04 from Canvas (user 101), one person:
    Canvas's file of lesson 04 holds back nothing of 1201, who has no lesson 04 to write, and
    Moodle's export does not call Canvas's user a stranger to the worksheet."""
    from grader.outputs.export import export

    course, said = fake_course(tmp_path, [
        row("1201", "01_float_formats", 15.0, source="moodle", name="Ada"),
        row("101", "04_backprop_flops", 9.0, source="canvas", name="Ada")])
    (tmp_path / "a.csv").write_text("lesson,title,id,points\n04_backprop_flops,Backprop,4250,\n")
    export(course, tmp_path / "canvas.csv", "canvas", None, tmp_path / "a.csv")
    held = tmp_path / "canvas-not-exported.csv"
    assert not held.exists() or len(held.read_text().splitlines()) == 1  # its header alone
    worksheet = tmp_path / "w.csv"
    worksheet.write_text("Identifier,Full name,Email address\nParticipant 1201,Ada,ada@x.fr\n")
    export(course, tmp_path / "moodle.csv", "moodle", worksheet)
    assert not any("not on the roster" in line for line in said), said
