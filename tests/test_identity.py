"""One identity per student and one key per course (grader/gradebook/identity.py,
grader/gradebook/coursestate.py, grader/intake/rosters.py): each student graded on the numbers
drawn for the id they worked under, whatever id their LMS's download gives them.

Lesson 01 (its graded prediction varies per student), graded in one batch per download:
students who worked in the lab under their course id (their e-mail, a SID), handed in
through Moodle, Gradescope (a group) and as folders.
"""

from __future__ import annotations

import json
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
                    "--reason", "another student id", "--course-dir", course)
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


def test_the_stored_roster_refuses_an_id_for_two_students_across_files(tmp_path) -> None:
    from grader.gradebook.identity import read_roster, store_roster
    from grader.intake.rosters import read_people

    course, _ = _course(tmp_path / "course")
    canvas = tmp_path / "gradebook.csv"
    canvas.write_text("Student,ID,SIS User ID,SIS Login ID,Section\n"
                      "\"Lovelace, Ada\",101,S1,ada,A\n\"Roe, Rick\",102,S2,rick,A\n")
    assert store_roster(course.db_url, read_people(canvas)) == (2, 6)
    assert store_roster(course.db_url, read_people(canvas)) == (0, 0)  # again: nothing new
    ours = tmp_path / "ours.csv"
    ours.write_text("student_id,lms_id\nrick,101\n")  # Canvas's 101 is ada's
    with pytest.raises(CourseError, match=r"the Canvas user id '101' to two students: 'ada' "
                                          r"\(.*gradebook.csv, line 2\) and 'rick'"):
        store_roster(course.db_url, read_people(ours))
    assert read_roster(course.db_url).ids[("canvas", "101")] == "ada"  # nothing stored
    worksheet = tmp_path / "w.csv"
    worksheet.write_text(WORKSHEET_HEADER + "Participant 5,Ada,ada@uni.fr,,,10,Yes,-,-\n")
    with pytest.raises(CourseError, match="--lesson LESSON"):
        read_people(worksheet)
    store_roster(course.db_url, read_people(worksheet, course_id="email",
                                            lesson=LESSON.name))
    roster = read_roster(course.db_url)
    assert roster.find("moodle", "5", "", LESSON.name) == ({"ada@uni.fr"},
                                                           f"Moodle participant 5 of "
                                                           f"{LESSON.name}")
    assert roster.find("moodle", "5", "", "02_tensors_and_strides")[0] == set()
    assert roster.find("folders", "rick", "", LESSON.name)[0] == {"rick"}
    assert roster.find("gradescope", "S1", "", LESSON.name)[0] == {"ada"}  # a SID: its SIS id


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
def test_feedback_waits_for_every_due_date_and_extension_unless_told(term) -> None:
    course = term["course"]
    deadlines = course / "deadlines.toml"
    try:
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
    finally:
        deadlines.unlink(missing_ok=True)
