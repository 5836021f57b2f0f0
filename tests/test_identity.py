"""One identity per student and one key per course (grader/gradebook/identity.py,
grader/gradebook/coursestate.py, grader/intake/rosters.py): each student graded on the numbers
drawn for the id they worked under, whatever id their LMS's download gives them.

Lesson 01 (its graded prediction varies per student), graded in one batch per download:
students who worked in the lab under their course id (their e-mail, a SID), handed in
through Moodle, Gradescope (a group) and as folders.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import nbformat
import pytest

from grader.common.errors import CourseError
from grader.content.lessons import load_lesson
from tests.grading_helpers import (
    answered,
    cell,
    grader,
    points,
    read_export,
    read_notebook,
    released_course,
    submit,
)

LESSON = load_lesson("01_float_formats")
NOTEBOOK = LESSON.notebook.name
PREDICTION = "predicted_bf16_stall"
FULL = sum(points(read_notebook(LESSON.notebook)).values())


def worked(student_nb, key: bytes, course_id: str | None, index: int | None = None,
           recorded: str | None = "", answer_of: int | None = None):
    """The student version answered as a student who worked in the lab drawn for
    ``course_id`` (None: no id, the defaults) would hand it in: every exercise done, the graded
    prediction written as the number their numbers ask for (of variant ``answer_of``, else
    their own), and the variant cell's output saying whom it drew for (``recorded``, else
    ``course_id``), with the course's key."""
    from nbformat.v4 import new_output

    from grader.content.variants import fingerprint, lesson_draw
    from grader.grading.plans import variant_answer

    if index is None:
        index = lesson_draw(key, LESSON, course_id).variants[PREDICTION] if course_id else 0
    nb = answered(student_nb, LESSON)
    answer = variant_answer(LESSON, PREDICTION, index if answer_of is None else answer_of)
    cell(nb, PREDICTION).source = f"{PREDICTION} = {float(answer)!r}"
    who = course_id if recorded == "" else recorded
    cell(nb, f"variant-{PREDICTION}").outputs = [new_output(
        "display_data", data={"text/plain": "Your numbers: ..."},
        metadata={"counting_the_cost": {"variant": {
            "exercise": f"{LESSON.name}/{PREDICTION}", "student": who, "index": index,
            "course": fingerprint(key) if who else ""}}})]
    return nb


def moodle_folder(full_name: str, participant: int) -> str:
    """Moodle's folder of one submission (mod/assign/classes/downloader.php)."""
    return f"{full_name}_{participant}_assignsubmission_file_"


def zipped(folder: Path) -> Path:
    archive = folder.with_suffix(".zip")
    with zipfile.ZipFile(archive, "w") as handle:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                handle.write(path, path.relative_to(folder.parent))
    return archive


def ids_for(key: bytes, count: int) -> list[str]:
    """``count`` e-mails whose draws of the prediction are not the default, so that grading
    on the default numbers would cost the point."""
    from grader.content.variants import lesson_draw

    found = []
    for i in range(500):
        email = f"student{i}@uni.edu"
        index = lesson_draw(key, LESSON, email).variants[PREDICTION]
        if index != 0:
            found.append(email)
        if len(found) == count:
            return found
    raise AssertionError("no ids draw such variants")


WORKSHEET_HEADER = ("Identifier,Full name,Email address,Status,Grade,Maximum Grade,"
                    "Grade can be changed,Last modified (submission),Last modified (grade)\n")


@pytest.fixture(scope="module")
def term(tmp_path_factory, shared_tmp):
    """One course and its key; a Moodle download of three students who worked under their
    e-mails (refused before its worksheet is on the roster, then graded); a Gradescope
    group's hand-in worked for one member; a student who worked on the default numbers
    (flagged, shown in review, accepted), then handed in another student's notebook."""
    from grader.content.variants import course_key

    tmp = tmp_path_factory.mktemp("term")
    course = released_course([LESSON], shared_tmp, tmp / "course")
    key = course_key(course)
    student = read_notebook(course / "release" / LESSON.name / NOTEBOOK)
    emails = ids_for(key, 3)
    moodle = tmp / "moodle" / "CS101-Floats-77"
    for number, email in enumerate(emails, start=7001):
        folder = moodle / moodle_folder(f"Student {number}", number)
        folder.mkdir(parents=True)
        nbformat.write(worked(student, key, email), folder / NOTEBOOK)
    download = zipped(moodle)
    refused = grader("autograde", LESSON.name, download, "--course-dir", course, check=False)
    (tmp / "worksheet.csv").write_text(WORKSHEET_HEADER + "".join(
        f"Participant {number},Student {number},{email},Submitted,,10.00,Yes,-,-\n"
        for number, email in enumerate(emails, start=7001)))
    roster = grader("roster", tmp / "worksheet.csv", "--lesson", LESSON.name,
                    "--course-dir", course)
    codes = grader("variants", "--course-dir", course).stdout  # before anyone is graded
    moodle_run = grader("autograde", LESSON.name, download, "--course-dir", course,
                        "--jobs", "2")

    # Gradescope: one group submission of two students, worked in the lab by the second.
    scope = tmp / "gradescope" / "assignment_9_export"
    (scope / "submission_1").mkdir(parents=True)
    (scope / "submission_metadata.yml").write_text(
        "submission_1:\n  :submitters:\n"
        "  - :name: Una One\n    :sid: '9001'\n    :email: una@uni.edu\n"
        "  - :name: Dos Two\n    :sid: '9002'\n    :email: dos@uni.edu\n"
        "  :created_at: 2025-12-04 05:26:26.899837000 Z\n")
    nbformat.write(worked(student, key, "9002"), scope / "submission_1" / NOTEBOOK)
    group_run = grader("autograde", LESSON.name, zipped(scope), "--course-dir", course,
                       "--jobs", "2")

    # A student who worked without an id (the default numbers), as folders.
    dana = ids_for(key, 1)[0].replace("@uni.edu", "")
    folders = tmp / "folders"
    submit(folders, dana, worked(student, key, None), NOTEBOOK)
    grader("autograde", LESSON.name, folders, "--course-dir", course)
    shown = grader("review", LESSON.name, dana, "--course-dir", course).stdout
    listed = grader("review", LESSON.name, "--course-dir", course).stdout
    accept = grader("review", LESSON.name, "--accept-all", "--reason", "default numbers",
                    "--reason", "in place of", "--course-dir", course)
    grader("export", "--course-dir", course, "--csv", tmp / "before.csv")
    # ... then she hands in a copy of a Moodle student's notebook: the accept was not of it.
    submit(folders, dana, worked(student, key, emails[0]), NOTEBOOK)
    grader("autograde", LESSON.name, folders, "--course-dir", course)
    grader("export", "--course-dir", course, "--csv", tmp / "grades.csv")
    return {"course": course, "key": key, "tmp": tmp, "emails": emails, "refused": refused,
            "roster": roster, "codes": codes, "moodle": moodle_run, "group": group_run,
            "dana": dana,
            "shown": shown, "listed": listed, "accept": accept,
            "before": read_export(tmp / "before.csv"), "grades": read_export(tmp / "grades.csv"),
            "status": json.loads((course / "grading_status.json").read_text())[LESSON.name]}


pytestmark = pytest.mark.xdist_group("identity")


@pytest.mark.slow
def test_the_codes_go_out_as_a_mail_merge_with_the_rosters_names_and_e_mails(term,
                                                                            tmp_path) -> None:
    """``variants --csv FILE``: course id, name, e-mail and code of each student of the roster
    (here the Moodle worksheet's three), the codes those the terminal shows."""
    import csv

    from grader.content.variants import student_code

    done = grader("variants", "--csv", tmp_path / "codes.csv", "--course-dir", term["course"])
    with (tmp_path / "codes.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["course_id"] for r in rows] == sorted(term["emails"])
    for number, email in enumerate(term["emails"], start=7001):
        [mine] = [r for r in rows if r["course_id"] == email]
        assert (mine["name"], mine["email"], mine["code"]) == (
            f"Student {number}", email, student_code(term["key"], email))
        assert f"{email}\t{mine['code']}" in done.stdout
    # Moodle delivers them: the assignment's worksheet, downloaded in German, written back with
    # each participant's code in its feedback comment (its grades left blank: the upload
    # changes none), read as Moodle's upload reads it (by its headings)
    from grader.intake.worksheet import HEADINGS

    german = [HEADINGS[name][1] for name in WORKSHEET_HEADER.strip().split(",")]
    sheet = tmp_path / "bewertungstabelle.csv"
    sheet.write_text(",".join([*german, "Feedback als Kommentar"]) + "\n" + "".join(
        f"Teilnehmer/in{number},Student {number},{email},Abgegeben,,10,Ja,-,-,\n"
        for number, email in enumerate(term["emails"], start=7001)))
    done = grader("variants", "--worksheet", sheet, "--lesson", LESSON.name, "--course-dir",
                  term["course"], check=False)
    assert done.returncode == 2 and "--comment-column" in done.stderr
    assert "'Feedback als Kommentar'" in done.stderr  # the worksheet's feedback columns, named
    grader("variants", "--worksheet", sheet, "--lesson", LESSON.name, "--comment-column",
           "Feedback als Kommentar", "--out", tmp_path / "upload.csv", "--course-dir",
           term["course"])
    with (tmp_path / "upload.csv").open(encoding="utf-8-sig") as handle:
        upload = list(csv.DictReader(handle))
    assert len(upload) == 3 and all(r[HEADINGS["Grade"][1]] == "" for r in upload)
    for number, email in enumerate(term["emails"], start=7001):
        [mine] = [r for r in upload if r["ID"] == f"Teilnehmer/in{number}"]
        code = student_code(term["key"], email)
        assert f"make lab STUDENT={email} CODE={code}" in mine["Feedback als Kommentar"]


@pytest.mark.slow
def test_every_row_names_the_course_id_and_the_records_have_one_row_per_person(
        term, tmp_path) -> None:
    """grades.csv keys a Moodle student's row by the participant id of that assignment, and
    names the course id (the e-mail the roster maps it to) and the e-mail beside it; the
    per-person export has one row per course id, the group's members each their own."""
    import csv

    moodle = {r["course_id"]: r for (student, _), r in term["grades"].items()
              if student.startswith("70")}  # Moodle's participant ids 7001-7003
    assert set(moodle) == set(term["emails"])
    assert all(r["email"] == email for email, r in moodle.items())
    grader("export", "--per-person", "--csv", tmp_path / "people.csv", "--course-dir",
           term["course"])
    with (tmp_path / "people.csv").open() as handle:
        people = {r["course_id"]: r for r in csv.DictReader(handle)}
    assert set(term["emails"]) | {"9001", "9002", term["dana"]} <= set(people)
    assert all(people[email][LESSON.name] != "" for email in term["emails"])


@pytest.mark.slow
def test_a_moodle_download_is_refused_until_its_worksheet_maps_its_participants(term) -> None:
    refused = term["refused"]
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "participant id" in refused.stderr and "python -m grader roster WORKSHEET.csv " \
        f"--lesson {LESSON.name}" in refused.stderr
    assert "3 student(s) read" in term["roster"].stdout
    from grader.content.variants import student_code

    assert term["codes"].splitlines() == [f"{email}\t{student_code(term['key'], email)}"
                                          for email in sorted(term["emails"])]


@pytest.mark.slow
def test_moodle_students_who_worked_under_their_email_earn_every_point_unflagged(term) -> None:
    assert "3 graded, 0 needs_review, 0 invalid of 3" in term["moodle"].stdout, \
        term["moodle"].stdout
    for number, email in enumerate(term["emails"], start=7001):
        row = term["grades"][(str(number), LESSON.name)]
        assert (float(row["score"]), row["status"]) == (FULL, "graded"), row
        assert term["status"][str(number)]["handin"]["course_id"] == email
        assert term["status"][str(number)]["drawn_for"] == email


@pytest.mark.slow
def test_a_gradescope_group_is_judged_on_the_numbers_of_the_member_it_was_worked_for(
        term) -> None:
    assert "2 graded, 0 needs_review, 0 invalid of 2" in term["group"].stdout, \
        term["group"].stdout
    for sid in ("9001", "9002"):
        row = term["grades"][(sid, LESSON.name)]
        assert (float(row["score"]), row["status"], row["reason"]) == (FULL, "graded", ""), row
        assert term["status"][sid]["drawn_for"] == "9002"  # the member it was worked for
        assert term["status"][sid]["handin"]["group"] == ["9001", "9002"]


@pytest.mark.slow
def test_review_shows_the_numbers_a_notebook_was_worked_on_and_accepts_them_in_bulk(
        term) -> None:
    from grader.content.variants import variants_of
    from grader.grading.plans import variant_answer

    said = variants_of(LESSON)[PREDICTION].said(0)
    default = variant_answer(LESSON, PREDICTION, 0)
    for text in (term["shown"], term["listed"]):
        assert f"worked on the default numbers ({said}), whose answer is" in text, text
        assert "the student's number" in text and "is inside that answer's band" in text
        assert f"{default:g}" in text or str(default) in text
    assert "accepted the computed score of 1 flagged" in term["accept"].stdout
    before = term["before"][(term["dana"], LESSON.name)]
    assert before["status"] == "graded" and float(before["score"]) == FULL - 1


@pytest.mark.slow
def test_an_accept_settles_only_the_notebook_it_was_made_on(term) -> None:
    row = term["grades"][(term["dana"], LESSON.name)]
    assert row["status"] == "needs_review", row  # a later, different notebook: looked at again
    assert "drawn for another student id" in row["reason"]
    assert "made on an earlier notebook" in row["reason"]
    assert row["review"] == "accepted"


# ------------------------------------------------------------------ the course's key


def _course(path: Path, **options):
    from grader.course import Course

    said: list[str] = []
    return Course(path, log=said.append, **options), said


@pytest.mark.slow
def test_a_lost_or_foreign_key_refuses_grading_release_and_a_new_key(tmp_path,
                                                                     shared_tmp) -> None:
    """The gradebook keeps its key's fingerprint: without the key, or with another, every
    command that draws numbers refuses, naming the key to restore; restoring it works."""
    from grader.content.variants import KEY_FILE, fingerprint

    root = released_course([LESSON], shared_tmp, tmp_path / "course")
    key = (root / KEY_FILE).read_bytes()
    (root / KEY_FILE).unlink()
    for command in (["autograde", LESSON.name, tmp_path], ["release", LESSON.name],
                    ["variants", "ana"]):
        done = grader(*command, "--course-dir", root, check=False)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert f"fingerprint is {fingerprint(key)}" in done.stderr and "restore" in done.stderr
        assert not (root / KEY_FILE).exists()  # no new key made in its place
    (root / KEY_FILE).write_bytes(bytes(range(32)))
    (root / KEY_FILE).chmod(0o600)
    done = grader("variants", "ana", "--course-dir", root, check=False)
    assert done.returncode == 2 and "is not the key this course's gradebook" in done.stderr
    (root / KEY_FILE).write_bytes(key)
    assert grader("variants", "ana", "--course-dir", root).stdout.startswith(
        f"ana\t{fingerprint(key)}-")


@pytest.mark.slow
def test_a_second_coordinator_on_the_same_database_must_share_the_key(tmp_path,
                                                                      shared_tmp) -> None:
    from grader.content.variants import KEY_FILE

    first = released_course([LESSON], shared_tmp, tmp_path / "first")
    database = f"sqlite:///{first / 'gradebook.db'}"
    second = tmp_path / "second"
    done = grader("release", LESSON.name, "--course-dir", second, "--db-url", database,
                  check=False)
    assert done.returncode == 2 and "restore that variants.key" in done.stderr, done.stderr
    assert "coordinators sharing a database share the key" in done.stderr
    (second / KEY_FILE).write_bytes(bytes(32))  # a key of its own: refused too
    (second / KEY_FILE).chmod(0o600)
    done = grader("release", LESSON.name, "--course-dir", second, "--db-url", database,
                  check=False)
    assert done.returncode == 2 and "is not the key this course's gradebook" in done.stderr
    (second / KEY_FILE).write_bytes((first / KEY_FILE).read_bytes())  # as docs say: copied
    grader("release", LESSON.name, "--course-dir", second, "--db-url", database)


@pytest.mark.slow
def test_a_course_released_before_keys_existed_is_keyless_and_stays_so(tmp_path,
                                                                      shared_tmp) -> None:
    from sqlalchemy import delete

    from grader.content.variants import KEY_FILE
    from grader.gradebook import ledger
    from grader.gradebook.coursestate import FINGERPRINT, KEYLESS, read_state

    root = released_course([LESSON], shared_tmp, tmp_path / "course")
    (root / KEY_FILE).unlink()  # as an older version left it: no key, no fingerprint
    course, said = _course(root)
    with ledger.engine(course.db_url).begin() as connection:
        connection.execute(delete(ledger.COURSE_STATE))
    assert course.key(create=True) is None  # recognised, and no key made
    assert read_state(course.db_url, FINGERPRINT) == KEYLESS
    assert any("before courses had keys" in line for line in said)
    assert not (root / KEY_FILE).exists()
    grader("release", LESSON.name, "--course-dir", root)
    assert not (root / KEY_FILE).exists()
    grader("release", LESSON.name, "--new-key", "--course-dir", root)
    assert (root / KEY_FILE).exists() and course.key() is not None


def test_a_lost_key_is_told_from_a_keyless_course_by_the_notebooks_it_graded(tmp_path) -> None:
    """No key and no fingerprint, but graded notebooks that record one: the key existed, so
    it must be restored (not taken for a course that never had one)."""
    from grader.gradebook.coursestate import _recorded_fingerprints

    folder = tmp_path / "autograded" / "ana" / LESSON.name
    folder.mkdir(parents=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("", outputs=[
        nbformat.v4.new_output("display_data", data={"text/plain": "x"}, metadata={
            "counting_the_cost": {"variant": {"exercise": "e", "student": "ana", "index": 1,
                                              "course": "abcdef012345"}}})])])
    nbformat.write(nb, folder / NOTEBOOK)
    assert _recorded_fingerprints(tmp_path) == {"abcdef012345"}


# ------------------------------------------------------------------ rosters


def test_a_roster_that_maps_one_id_two_ways_is_refused_with_the_rows_named(tmp_path) -> None:
    from grader.intake.rosters import read_people, read_roster, read_rosters

    doubled = tmp_path / "doubled.csv"
    doubled.write_text("student_id,lms_id,email\nana,101,ana@uni.edu\nbo,102,bo@uni.edu\n"
                       "ana,103,ana@uni.edu\n")
    for read in (read_roster, read_people):
        with pytest.raises(CourseError, match=r"'ana' twice, in two ways \(lines 2 and 4\)"):
            read(doubled)
    for text, message in [
            ("student_id,email\n", "holds no student"),
            ("student_id,email,email\nana,a@x,b@x\n", "names the column 'email' twice"),
            ("student_id,email\nana,a@x\x00\n", "NUL character"),
            ("student_id,email\nana," + "a" * 250 + "@x\n", "longer than 200 characters"),
            ("student_id,email\nana,a\x1b[2J@x\n", "control characters")]:
        doubled.write_text(text)
        with pytest.raises(CourseError, match=message):
            read_people(doubled)
    doubled.write_text("student_id;email\nana;a@x\n")  # a spreadsheet's semicolons
    assert read_people(doubled)[0][0].ids == (("email", "a@x"),)
    shared = tmp_path / "shared.csv"
    shared.write_text("student_id,lms_id\nana,101\nbo,101\n")
    with pytest.raises(CourseError, match=r"lms_id '101' to two students, 'ana' \(.*line 2\) "
                                          r"and 'bo' \(.*line 3\)"):
        read_roster(shared)
    one, other = tmp_path / "one.csv", tmp_path / "other.csv"
    one.write_text("student_id,lms_id\nana,101\n")
    other.write_text("student_id,lms_id\nana,104\n")
    with pytest.raises(CourseError, match=r"another lms_id in .*other\.csv than in .*one\.csv"):
        read_rosters([one, other])
    same = tmp_path / "same.csv"
    same.write_text("student_id,lms_id\nana,101\nana,101\n")  # a row twice, the same: kept once
    assert read_roster(same) == read_roster(one)
    # one e-mail, one person: in another case or another Unicode form (NFC against NFD), as a
    # course id or as an LMS's e-mail, it is refused with its lines named
    import unicodedata

    nfc, nfd = (unicodedata.normalize(form, "anna.müller@uni.de") for form in ("NFC", "NFD"))
    for first, second in ((nfc, nfd), ("Anna.M@Uni.de", "anna.m@uni.de")):
        twice = tmp_path / "twice.csv"
        twice.write_text(f"student_id,email\n{first},{first}\nbo,bo@uni.de\n"
                         f"{second},{second}\n", encoding="utf-8")
        if first.isascii():  # a course id must be ASCII; an LMS's e-mail need not be
            with pytest.raises(CourseError, match=r"twice, in two ways \(lines 2 and 4, there "):
                read_people(twice)
        twice.write_text(f"student_id,email\nana,{first}\nbo,bo@uni.de\nanna,{second}\n",
                         encoding="utf-8")
        for read in (read_roster, read_people):
            with pytest.raises(CourseError, match=r"gives email .* to two students, 'ana' "
                                                  r"\(.*line 2\) and 'anna' \(.*line 4\)"):
                read(twice)


def test_the_stored_roster_refuses_an_id_for_two_students_across_files(tmp_path) -> None:
    from grader.gradebook.identity import read_roster, store_roster
    from grader.intake.rosters import read_people

    course, _ = _course(tmp_path / "course")
    canvas = tmp_path / "gradebook.csv"
    canvas.write_text("Student,ID,SIS User ID,SIS Login ID,Section\n"
                      "\"Lovelace, Ada\",101,S1,ada,A\n\"Roe, Rick\",102,S2,rick,A\n")
    assert store_roster(course.db_url, read_people(canvas)[0]) == (2, 8)  # course, 3 ids each
    assert store_roster(course.db_url, read_people(canvas)[0]) == (0, 0)  # again: nothing new
    ours = tmp_path / "ours.csv"
    ours.write_text("student_id,lms_id\nrick,101\n")  # Canvas's 101 is ada's
    with pytest.raises(CourseError, match=r"the Canvas user id '101' to two students: 'ada' "
                                          r"\(.*gradebook.csv, line 2\) and 'rick'"):
        store_roster(course.db_url, read_people(ours)[0])
    assert read_roster(course.db_url).ids[("canvas", "101")] == "ada"  # nothing stored
    worksheet = tmp_path / "w.csv"
    worksheet.write_text(WORKSHEET_HEADER + "Participant 5,Ada,ada@uni.fr,,,10,Yes,-,-\n")
    with pytest.raises(CourseError, match="--lesson LESSON"):
        read_people(worksheet)
    wrong = tmp_path / "wrong-lesson.csv"  # first given for the wrong lesson by mistake
    wrong.write_text(WORKSHEET_HEADER + "Participant 9,Ada,ada@uni.fr,,,10,Yes,-,-\n")
    store_roster(course.db_url, read_people(wrong, lesson=LESSON.name)[0])
    store_roster(course.db_url, read_people(worksheet, course_id="email",
                                            lesson=LESSON.name)[0])  # the right one replaces it
    assert read_roster(course.db_url).find("moodle", "9", "", LESSON.name)[0] == set()
    roster = read_roster(course.db_url)
    assert roster.find("moodle", "5", "", LESSON.name) == ({"ada@uni.fr"},
                                                           f"Moodle participant 5 of "
                                                           f"{LESSON.name}")
    assert roster.find("moodle", "5", "", "02_tensors_and_strides")[0] == set()
    assert roster.find("folders", "rick", "", LESSON.name)[0] == {"rick"}
    assert roster.find("gradescope", "S1", "", LESSON.name)[0] == {"ada"}  # a SID: its SIS id
    # one e-mail typed two ways in two files (Moodle's worksheet, Canvas's SIS login) is one
    # student: course ids are stored as the draw reads them
    other, _ = _course(tmp_path / "other")
    (tmp_path / "w2.csv").write_text(
        WORKSHEET_HEADER + "Participant 5,Anna Müller,Anna.M@Uni.de,,,10,Yes,-,-\n")
    (tmp_path / "g2.csv").write_text("Student,ID,SIS User ID,SIS Login ID,Section\n"
                                     "\"Müller, Anna\",301,S9,anna.m@uni.de,A\n")
    store_roster(other.db_url, read_people(tmp_path / "w2.csv", lesson=LESSON.name)[0])
    store_roster(other.db_url, read_people(tmp_path / "g2.csv")[0])
    both = read_roster(other.db_url)
    assert list(both.people) == ["anna.m@uni.de"]
    assert both.find("canvas", "301", "", LESSON.name)[0] == \
        both.find("moodle", "5", "", LESSON.name)[0] == {"anna.m@uni.de"}


def test_one_sid_given_to_two_students_grades_both_apart_and_flags_both(tmp_path) -> None:
    from grader.intake.handins import recognise

    root = tmp_path / "assignment_1_export"
    for name in ("submission_1", "submission_2"):
        (root / name).mkdir(parents=True)
        (root / name / NOTEBOOK).write_text("{}")
    (root / "submission_metadata.yml").write_text(
        "submission_1:\n  :submitters:\n  - :name: Ana\n    :sid: '77'\n"
        "    :email: ana@uni.edu\n  :created_at: 2025-12-04 05:00:00 Z\n"
        "submission_2:\n  :submitters:\n  - :name: Bo\n    :sid: '77'\n"
        "    :email: bo@uni.edu\n  :created_at: 2025-12-04 06:00:00 Z\n")
    _, handins, _ = recognise(root, LESSON.name, NOTEBOOK)
    assert sorted(h.student_id for h in handins) == ["ana@uni.edu", "bo@uni.edu"]
    for handin in handins:
        assert handin.notebook is not None  # both graded, neither dropped
        assert any("SID '77' to 1 other student(s) too" in r for r in handin.reasons)


def test_a_canvas_download_without_the_roster_is_refused_saying_what_to_give(
        tmp_path, shared_tmp) -> None:
    course = released_course([LESSON], shared_tmp, tmp_path / "course")
    download = tmp_path / "submissions"
    download.mkdir()
    blank = (course / "release" / LESSON.name / NOTEBOOK).read_bytes()
    (download / f"lovelaceada_101_901_{NOTEBOOK}").write_bytes(blank)
    (download / f"roerick_102_902_{NOTEBOOK}").write_bytes(blank)
    done = grader("autograde", LESSON.name, download, "--course-dir", course, check=False)
    assert done.returncode == 2 and "Canvas's gradebook export" in done.stderr, done.stderr
    (download / f"lovelaceada_101_901_{NOTEBOOK}").unlink()
    (download / f"roerick_102_902_{NOTEBOOK}").unlink()
    (download / f"anon_x7_901_{NOTEBOOK}").write_bytes(blank)
    (download / f"anon_y8_902_{NOTEBOOK}").write_bytes(blank)
    done = grader("autograde", LESSON.name, download, "--course-dir", course, check=False)
    assert done.returncode == 2 and "anonymous grading" in done.stderr, done.stderr
    assert not (course / "submitted").exists()  # refused before grading anyone


# ------------------------------------------------------------------ feedback and due dates


@pytest.mark.slow
def test_feedback_waits_for_every_due_date_and_extension_unless_told(term, tmp_path) -> None:
    course = tmp_path / "course"  # a copy: the module's term stays as its batches left it
    shutil.copytree(term["course"], course, symlinks=True)
    deadlines = course / "deadlines.toml"
    deadlines.write_text(f'timezone = "UTC"\n[lessons.{LESSON.name}]\n'
                         'due = "2099-01-01 00:00"\n')
    done = grader("feedback", LESSON.name, "--course-dir", course, check=False)
    assert done.returncode == 2 and "is not yet due for everyone (due 2099-01-01" \
        in done.stderr and "--before-due" in done.stderr, done.stderr
    assert not list((course / "feedback").glob(f"*/{LESSON.name}/*.html"))
    deadlines.write_text(f'timezone = "UTC"\n[lessons.{LESSON.name}]\n'
                         'due = "2020-01-01 00:00"\n[[extensions]]\nstudent = "7001"\n'
                         f'lesson = "{LESSON.name}"\ndue = "2099-02-01 00:00"\n')
    done = grader("feedback", LESSON.name, "--course-dir", course, check=False)
    assert done.returncode == 2 and "7001 (extended to 2099-02-01" in done.stderr
    grader("feedback", LESSON.name, "--before-due", "--course-dir", course)
    assert (course / "feedback" / "7002" / LESSON.name).is_dir()
    deadlines.write_text(f'timezone = "UTC"\n[lessons.{LESSON.name}]\n'
                         'due = "2020-01-01 00:00"\n')
    grader("feedback", LESSON.name, "--course-dir", course)  # all due: made


def test_a_canvas_row_without_the_course_id_is_left_out_and_named(tmp_path) -> None:
    from grader.intake.rosters import read_people

    canvas = tmp_path / "gradebook.csv"
    canvas.write_text("Student,ID,SIS User ID,SIS Login ID,Section\n"
                      "\"Lovelace, Ada\",101,S1,ada,A\n\"Student, Test\",999,,,A\n")
    people, left_out = read_people(canvas)
    assert [p.course_id for p in people] == ["ada"]
    assert left_out == ["line 3 (Student, Test): no sis_login_id"]


def test_an_email_is_one_student_however_it_is_typed(tmp_path) -> None:
    """A roster's "Anna.M@Uni.de" and the lab's "anna.m@uni.de" draw the same numbers, and a
    notebook that records one is not flagged as drawn for the other."""
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from grader.content.variants import lesson_draw
    from grader.grading.autograde import drawn_elsewhere

    key = bytes(range(32))
    upper, lower = lesson_draw(key, LESSON, "Anna.M@Uni.de"), lesson_draw(key, LESSON,
                                                                          "anna.m@uni.de")
    assert upper == lower and upper.student == "anna.m@uni.de"
    nb = new_notebook(cells=[new_code_cell("", outputs=[new_output(
        "display_data", data={"text/plain": "x"}, metadata={"counting_the_cost": {"variant": {
            "exercise": f"{LESSON.name}/{PREDICTION}", "student": "ANNA.M@uni.de",
            "index": upper.variants[PREDICTION], "course": upper.course}}})])])
    assert drawn_elsewhere(nb, LESSON, upper) == []


def test_a_decision_settles_nothing_of_a_later_notebook_or_of_no_notebook() -> None:
    from grader.gradebook.decisions import replay

    def state(*rows):
        return replay([{"lesson": "l", "student_id": "s", "exercise": "", "points": None,
                        "computed": None, "note": "", "at": float(i), "by": "me",
                        "action": action, "notebook_sha256": sha}
                       for i, (action, sha) in enumerate(rows)])[("l", "s")]

    accepted = state(("accept", "aaa"))
    assert accepted.resolved_for("aaa") and not accepted.made_elsewhere("aaa")
    assert not accepted.resolved_for("bbb") and accepted.made_elsewhere("bbb")
    assert not accepted.resolved_for("")  # a later hand-in with no notebook: still invalid
    assert state(("accept", "")).resolved_for("bbb")  # a decision the log did not tie
    total = state(("total", "aaa"))
    assert total.made_elsewhere("bbb")  # a score set on another notebook asks for a look


def _handin(student: str, **fields):
    from grader.intake.handins import Handin

    return Handin(student, notebook=Path("x.ipynb"), **fields)


def test_two_hand_ins_of_one_download_for_one_course_id_are_both_flagged(tmp_path) -> None:
    from grader.gradebook.identity import identify

    course, _ = _course(tmp_path / "course")
    eve = _handin("bob", email="eve@uni.edu", download_name="submission_2")
    bob = _handin("bob2", email="bob@uni.edu", download_name="submission_3")
    bob.course_id = "bob"
    alone = _handin("cy", download_name="submission_4")
    identify(course, LESSON.name, "gradescope", [eve, bob, alone], varies=True)
    # no roster: each stands for its own SID; only eve's and a hand-in mapped to "bob" clash
    assert eve.identity == [] and alone.identity == []
    twins = [_handin("bob", download_name="submission_5"),
             _handin("bob", download_name="submission_6")]
    identify(course, LESSON.name, "folders", twins, varies=True)
    assert all("2 hand-ins of this download stand for the course id 'bob'" in h.identity[0]
               for h in twins)


def test_a_new_hand_in_under_an_id_graded_for_someone_else_is_flagged(tmp_path) -> None:
    from grader.gradebook.identity import identify_handins

    course, _ = _course(tmp_path / "course")
    eve = _handin("bob", email="eve@uni.edu", name="Eve", download_name="submission_1")
    stored = {"bob": {"from": "folders", "name": "Bob", "email": ""}}
    identify_handins(course, LESSON, "gradescope", [eve], stored, varies=True, regrade=False)
    assert "was graded before from another download (folders, for Bob)" in eve.identity[0]
    same = _handin("bob", name="Bob")
    identify_handins(course, LESSON, "folders", [same], stored, varies=True, regrade=False)
    assert same.identity == []


def test_a_groups_notebook_with_no_record_of_whose_numbers_asks_for_a_look_where_it_can_cost(
        tmp_path) -> None:
    """A group's notebook that records no member's numbers is graded for each on their own,
    with a reason to look where a member can lose by it: it answers a prediction drawn apart
    for them. A blank one, or one whose members drew alike, loses nothing to the draw."""
    from grader.content.variants import lesson_draw
    from grader.gradebook.identity import draw_student
    from grader.grading.probe import exercises

    key = bytes(range(32))
    draws = {s: lesson_draw(key, LESSON, s).variants for s in (f"s{i}" for i in range(20))}
    apart = next(sorted([a, b]) for a in draws for b in draws if draws[a] != draws[b])
    alike = next(sorted([a, b]) for a in draws for b in draws
                 if a != b and draws[a] == draws[b])
    nb = nbformat.read(LESSON.notebook, as_version=4)  # the reference: every cell answered
    answered, blank = tmp_path / "answered.ipynb", tmp_path / "blank.ipynb"
    nbformat.write(nb, answered)
    prediction = next(e for e in exercises(LESSON) if e.prediction)
    cell(nb, prediction.name).source = prediction.stub
    nbformat.write(nb, blank)
    own = apart[1]
    whose, why = draw_student({"course_id": own, "group": apart}, own, answered, key, LESSON)
    assert whose == own and "records no member's numbers" in why
    for group, notebook in ((apart, blank), (alike, answered)):
        assert draw_student({"course_id": group[1], "group": group}, group[1], notebook, key,
                            LESSON) == (group[1], "")
    assert draw_student({"course_id": own, "group": apart}, own, answered, None,
                        LESSON) == (own, "")  # no key: everyone on the defaults
    assert draw_student({"course_id": own}, own, answered, key, LESSON) == (own, "")
    # worked for someone outside the group: graded on the member's own numbers, and the reason
    # is grading's, naming whose numbers they were (not "records no member's numbers")
    from grader.content.variants import Draw
    from grader.grading.autograde import drawn_elsewhere

    outsider = next(s for s in draws if s not in apart and draws[s] != draws[own])
    worked = nbformat.read(answered, as_version=4)
    shown = nbformat.v4.new_output("stream", name="stdout", text="your numbers\n")
    shown.metadata = {"counting_the_cost": {"variant": {
        "exercise": f"{LESSON.name}/{prediction.name}", "student": outsider,
        "index": draws[outsider][prediction.name], "course": ""}}}
    cell(worked, prediction.name).outputs = [shown]
    nbformat.write(worked, tmp_path / "outsider.ipynb")
    assert draw_student({"course_id": own, "group": apart}, own, tmp_path / "outsider.ipynb",
                        key, LESSON) == (own, "")
    [why] = drawn_elsewhere(worked, LESSON, Draw(LESSON.name, own, draws[own], group=tuple(apart)))
    assert f"drawn for another student id, {outsider!r}" in why


def test_a_keyless_course_refuses_hand_ins_drawn_with_a_key_and_takes_it_back(
        tmp_path) -> None:
    """Hand-ins that record a course's key, in a course that has none: the key was lost
    (before the gradebook kept its fingerprint): refused, and the key restored is taken."""
    from grader.content.variants import KEY_FILE, course_key, fingerprint
    from grader.gradebook.coursestate import (
        FINGERPRINT,
        KEYLESS,
        refuse_keyless_grading,
        write_state,
    )

    course, _ = _course(tmp_path / "course")
    key = course_key(tmp_path / "elsewhere", create=True)
    mark = fingerprint(key)
    notebooks = []
    for student in ("ana", "bo"):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("", outputs=[
            nbformat.v4.new_output("display_data", data={"text/plain": "x"}, metadata={
                "counting_the_cost": {"variant": {"exercise": "e", "student": student,
                                                  "index": 1, "course": mark}}})])])
        notebooks.append(tmp_path / f"{student}.ipynb")
        nbformat.write(nb, notebooks[-1])
    write_state(course.db_url, FINGERPRINT, KEYLESS)
    with pytest.raises(CourseError, match=f"2 of these hand-ins were worked with a key whose "
                                          f"fingerprint is {mark}"):
        refuse_keyless_grading(course, notebooks)
    (course.root / KEY_FILE).write_bytes(key)
    (course.root / KEY_FILE).chmod(0o600)
    assert course.key() == key  # restored: the fingerprint the hand-ins named
    refuse_keyless_grading(course, [*notebooks[:1], tmp_path / "none.ipynb"])  # one alone


def test_the_hub_draws_for_the_course_id_the_roster_gives_its_user(tmp_path) -> None:
    from grader.content.variants import course_key, lab_variants
    from grader.course import hub_variants
    from grader.gradebook.identity import store_roster
    from grader.intake.rosters import Person

    course, _ = _course(tmp_path / "course")
    key = course.key(create=True)
    assert key == course_key(course.root)
    store_roster(course.db_url, [Person("hu0@uni.edu", ids=(("username", "hu0"),))])
    assert json.loads(hub_variants(course.root, "hu0")) == json.loads(
        lab_variants(key, "hu0@uni.edu"))
    assert json.loads(hub_variants(course.root, "other")) == json.loads(
        lab_variants(key, "other"))


def test_extensions_may_name_a_student_by_course_id() -> None:
    from grader.gradebook.deadlines import match_student

    known = {"5001": {"name": "Ada", "email": "", "lms_id": "", "course_id": "ada@uni.fr"}}
    assert match_student("Ada@Uni.fr", known) == (["5001"], "course id")
