"""Per-exercise grades and the instructor's review, end to end: a real nbgrader gradebook,
the real commands (``autograde``, ``review``, ``export``, ``report``, ``feedback``).

One class of lesson 01 is graded once (module fixture); each test works on students of its
own, so that the decisions of one test never reach another's assertions.
"""

from __future__ import annotations

import copy
import csv
import html
import re
import subprocess
import time
from pathlib import Path

import pytest

from grader.content.lessons import load_lesson
from grader.gradebook import ledger
from grader.gradebook.decisions import replay
from tests.grading_helpers import (
    cell,
    grader,
    in_process,
    points,
    read_export,
    read_notebook,
    released_course,
    submit,
)

pytestmark = pytest.mark.slow

LESSON = load_lesson("01_float_formats")
NOTEBOOK = LESSON.notebook.name
POINTS = points(read_notebook(LESSON.notebook))
FULL = sum(POINTS.values())
WRONG_EPSILON = "def machine_epsilon(fmt):\n    return 2.0 ** -(fmt.mantissa_bits + 1)"
# Code that reaches for the file system: flagged needs_review, scored as usual.
FLAGGED_EPSILON = "import os\n" + WRONG_EPSILON
HOSTILE = '<script>alert(1)</script><img src=x onerror=alert(2)> [x](javascript:alert(3))'


def class_of(folder: Path, student_version: Path) -> None:
    """Six hand-ins: full marks; three flagged for code that reaches for the file system (two
    with one exercise wrong, one right); one exercise wrong; the untouched student version."""
    instructor = read_notebook(LESSON.notebook)
    flagged_wrong = copy.deepcopy(instructor)
    cell(flagged_wrong, "machine_epsilon").source = FLAGGED_EPSILON
    flagged_right = copy.deepcopy(instructor)
    cell(flagged_right, "tensor_bytes").source = "import os\n" + cell(
        flagged_right, "tensor_bytes").source
    wrong = copy.deepcopy(instructor)
    cell(wrong, "machine_epsilon").source = WRONG_EPSILON
    for student, nb in [("full", instructor), ("set_one", flagged_wrong),
                        ("kept", flagged_wrong), ("accepted", flagged_right),
                        ("totalled", wrong), ("untouched", read_notebook(student_version))]:
        submit(folder, student, nb, NOTEBOOK)


@pytest.fixture(scope="module")
def course(tmp_path_factory, shared_tmp):
    """Lesson 01 released and a class of six graded; the course directory."""
    tmp = tmp_path_factory.mktemp("review")
    root = released_course([LESSON], shared_tmp, tmp / "course")
    class_of(tmp / "class", root / "release" / LESSON.name / NOTEBOOK)
    done = grader("autograde", LESSON.name, tmp / "class", "--course-dir", root)
    assert "3 graded, 3 needs_review, 0 invalid of 6" in done.stdout
    return root


def command(*args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``python -m grader ARGS`` run in this process (tests/grading_helpers.py's
    ``in_process``), as ``grader`` runs most commands."""
    return in_process(*args, check=check)


def review(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return command("review", LESSON.name, *args, "--course-dir", root, check=check)


def export(root: Path, tmp_path: Path, *args: str) -> dict[tuple[str, str], dict[str, str]]:
    path = tmp_path / f"grades{len(list(tmp_path.glob('grades*.csv')))}.csv"
    command("export", "--course-dir", root, "--csv", path, *args)
    return read_export(path) if "--per-exercise" not in args else {
        (r["student_id"], r["exercise"]): r for r in csv.DictReader(path.open(newline=""))}


def log_of(root: Path, student: str) -> list[dict]:
    return ledger.read_decisions(f"sqlite:///{root / 'gradebook.db'}", LESSON.name, student)


# ------------------------------------------------------------------ per-exercise grades

@pytest.mark.xdist_group("review")
def test_the_csv_export_has_a_column_per_exercise_that_adds_up_to_the_score(course,
                                                                            tmp_path) -> None:
    rows = export(course, tmp_path)
    header = list(next(iter(rows.values())))
    assert header[:5] == ["student_id", "lesson", "score", "max_score", "status"]
    columns = [f"{LESSON.name}/{name}" for name in POINTS]
    assert [c for c in header if "/" in c] == columns  # in the notebook's order
    for (student, _), row in rows.items():
        if student in ("full", "untouched", "totalled"):
            assert sum(float(row[c]) for c in columns) == float(row["score"]), student
    assert float(rows[("full", LESSON.name)]["score"]) == FULL
    assert float(rows[("untouched", LESSON.name)]["score"]) == 0.0
    wrong = rows[("totalled", LESSON.name)]
    assert float(wrong[f"{LESSON.name}/machine_epsilon"]) == 0.0
    assert float(wrong[f"{LESSON.name}/decode"]) == POINTS["decode"]


@pytest.mark.xdist_group("review")
def test_per_exercise_export_is_one_row_per_student_and_exercise(course, tmp_path) -> None:
    rows = export(course, tmp_path, "--per-exercise")
    assert len(rows) == 6 * len(POINTS)
    row = rows[("untouched", "decode")]
    assert (float(row["score"]), float(row["max_score"])) == (0.0, POINTS["decode"])
    assert int(row["checks_passed"]) == 0 < int(row["checks_total"])
    done = command("export", "--course-dir", course, "--per-exercise", "--format", "canvas",
                   check=False)
    assert done.returncode == 2 and "--per-exercise writes the csv format" in done.stderr


@pytest.mark.xdist_group("review")
def test_report_gives_each_exercise_its_distribution_and_most_failed_check(course) -> None:
    done = command("report", LESSON.name, "--course-dir", course)
    with (course / "reports" / LESSON.name / "exercises.csv").open(newline="") as handle:
        found = {r["exercise"]: r for r in csv.DictReader(handle)}
    assert list(found) == list(POINTS)
    epsilon = found["machine_epsilon"]
    # full, accepted: 1; set_one, kept, totalled, untouched: 0 (before any review).
    assert epsilon["distribution"] == "0:4 1:2" and int(epsilon["full_marks"]) == 2
    assert epsilon["most_failed_check"].startswith("machine_epsilon(")
    assert int(epsilon["failed"]) == 4 and "expected" in epsilon["most_common_message"]
    assert "not implemented" in found["decode"]["most_common_message"]
    assert int(found["decode"]["failed"]) == 1
    assert "most failed check (4x): machine_epsilon(" in done.stdout


# ------------------------------------------------------------------ review

@pytest.mark.xdist_group("review")
def test_review_lists_the_flagged_submissions_with_their_reasons(course) -> None:
    out = review(course).stdout
    for student in ("set_one", "kept", "accepted"):
        line = next(x for x in out.splitlines() if x.strip().startswith(student))
        assert "needs_review" in line
    assert "code reaches for the file system" in out
    assert "full " not in out and "untouched" not in out


@pytest.mark.xdist_group("review")
def test_review_shows_the_instructor_what_each_failed_check_said_hidden_ones_too(
        course) -> None:
    """The student's feedback counts the hidden checks that failed; the instructor, deciding
    whether a zero is fair, reads what each said."""
    from grader.content.cases.floats import CASES

    hidden = str(CASES["machine_epsilon"][0])  # a hidden check the wrong epsilon fails
    shown = review(course, "totalled").stdout
    lines = shown.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("machine_epsilon "))
    below = "\n".join(lines[at + 1:at + 8])
    assert "    failed: machine_epsilon(" in below, shown
    assert f"    failed (hidden): {hidden}: " in below, shown
    assert "failed" not in "\n".join(line for line in lines if line.strip().startswith(
        ("decode ", "split_bits "))), "only the exercise that lost points lists its checks"

    # The graded notebook, which the feedback page shows, counts it and does not say it.
    graded = (course / "autograded" / "totalled" / LESSON.name / NOTEBOOK).read_text()
    assert re.search(r"\d hidden check\(s\) failed", graded) and hidden not in graded


@pytest.mark.xdist_group("review")
def test_the_review_command_exits_2_on_bad_input(course) -> None:
    done = grader("review", LESSON.name, "nobody", "--accept", "--course-dir", course,
                  check=False)
    assert done.returncode == 2
    assert "no graded submission of 01_float_formats by 'nobody'" in done.stderr


@pytest.mark.xdist_group("review")
@pytest.mark.parametrize("args, message", [
    (["nobody", "--accept"], "no graded submission of 01_float_formats by 'nobody'"),
    (["full", "--set", "no_such=1", "--note", "x"], "has no exercise 'no_such'"),
    (["full", "--set", "decode=3", "--note", "x"], "from 0 to 2"),
    (["full", "--set", "decode=-1", "--note", "x"], "from 0 to 2"),
    (["full", "--set", "decode=nan", "--note", "x"], "from 0 to 2"),
    (["full", "--set", "decode", "--note", "x"], "write EXERCISE=POINTS"),
    (["full", "--set", "decode=1"], "need --note"),
    (["full", "--total", f"{FULL + 1:g}", "--note", "x"], f"from 0 to {FULL:g}"),
    (["full", "--accept", "--set", "decode=1", "--note", "x"], "give one or the other"),
    (["--accept"], "name the STUDENT"),
    (["full", "--regrade", "--accept"], "run it on its own"),
    (["full", "--clear", "nope"], "has no exercise 'nope'"),
    (["full", "--by", "", "--accept"], "--by must be a name"),
])
def test_bad_review_input_exits_2_saying_what_is_wrong(course, args, message) -> None:
    done = review(course, *args, check=False)
    assert done.returncode == 2, done.stdout
    assert message in done.stderr
    assert log_of(course, "full") == []  # nothing was recorded


@pytest.mark.xdist_group("review")
def test_a_score_set_in_review_is_logged_exported_reported_and_shown_inert(course,
                                                                         tmp_path) -> None:
    before = time.time()
    done = review(course, "set_one", "--set", "machine_epsilon=1", "--note",
                  f"rounding slip {HOSTILE}", "--by", "prof_x")
    assert "set machine_epsilon to 1 (computed 0)" in done.stdout
    (row,) = log_of(course, "set_one")
    assert (row["action"], row["exercise"], row["points"], row["computed"], row["by"]) == \
        ("set", "machine_epsilon", 1.0, 0.0, "prof_x")
    assert before - 1 <= row["at"] <= time.time() + 1
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ prof_x", done.stdout)

    # nbgrader's gradebook: the human's score beside the grader's.
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        grade = gb.find_grade("test-machine_epsilon", LESSON.notebook_id, LESSON.name,
                              "set_one")
        assert (grade.auto_score, grade.manual_score, grade.score) == (0.0, 1.0, 1.0)

    rows = export(course, tmp_path)
    mine = rows[("set_one", LESSON.name)]
    assert (float(mine["score"]), float(mine["computed_score"]), mine["status"]) == \
        (FULL, FULL - 1, "graded")
    assert mine["review"] == "set machine_epsilon" and "prof_x" in mine["reviewed_by"]
    assert "code reaches for the file system" in mine["reason"]  # the grader's reason stays
    assert float(mine[f"{LESSON.name}/machine_epsilon"]) == 1.0
    per = export(course, tmp_path, "--per-exercise")[("set_one", "machine_epsilon")]
    assert (float(per["score"]), float(per["computed_score"]), per["overridden"]) == \
        (1.0, 0.0, "set")

    command("report", LESSON.name, "--course-dir", course)
    with (course / "reports" / LESSON.name / "flagged.csv").open(newline="") as handle:
        flagged = {r["student_id"]: r for r in csv.DictReader(handle)}
    assert flagged["set_one"]["review"] == "set machine_epsilon"
    assert flagged["kept"]["review"] == "open" or "set" in flagged["kept"]["review"]

    grader("feedback", LESSON.name, "--course-dir", course)
    page = (course / "feedback" / "set_one" / LESSON.name /
            f"{LESSON.notebook_id}.html").read_text()
    assert f"Score: {FULL:.1f} / {FULL:.1f}" in page
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    assert "rounding slip <script>alert(1)</script>" in text  # shown, as text
    assert "prof_x" in text and "machine_epsilon: 1 point(s) (the checks gave 0)" in text
    assert "<script>alert(1)" not in page and "<img src=x" not in page
    assert 'href="javascript' not in page


@pytest.mark.xdist_group("review")
def test_decisions_survive_autograde_and_go_only_when_discarded(course, tmp_path) -> None:
    review(course, "kept", "--set", "machine_epsilon=1", "--note", "fine")
    again = tmp_path / "again"
    submit(again, "kept", read_notebook(course / "submitted" / "kept" / LESSON.name / NOTEBOOK),
           NOTEBOOK)
    done = grader("autograde", LESSON.name, again, "--course-dir", course)
    assert "kept: kept review decisions (set machine_epsilon)" in done.stdout
    row = export(course, tmp_path)[("kept", LESSON.name)]
    assert (float(row["score"]), row["status"]) == (FULL, "graded")

    done = review(course, "kept", "--regrade", "--discard-overrides", "--by", "ta_y")
    assert "review decisions discarded" in done.stdout
    row = export(course, tmp_path)[("kept", LESSON.name)]
    assert (float(row["score"]), row["status"], row["review"]) == \
        (FULL - 1, "needs_review", "")
    actions = [(r["action"], r["by"]) for r in log_of(course, "kept")]
    assert actions[1:] == [("discard", "ta_y"), ("regrade", "ta_y")]
    shown = review(course, "kept").stdout  # the whole trail stays
    assert "set machine_epsilon to 1" in shown and "discarded every earlier decision" in shown


@pytest.mark.xdist_group("review")
def test_a_regrade_keeps_the_flags_of_the_hand_in_itself(tmp_path, shared_tmp) -> None:
    """A flag that the hand-in earned, not its code (here a notebook under another name), is
    not in the stored notebook: a regrade of that notebook keeps it, reason and status."""
    root = released_course([LESSON], shared_tmp, tmp_path / "course")
    submit(tmp_path / "class", "renamer", read_notebook(
        root / "release" / LESSON.name / NOTEBOOK), "float_formats (1).ipynb")
    grader("autograde", LESSON.name, tmp_path / "class", "--course-dir", root)
    before = export(root, tmp_path)[("renamer", LESSON.name)]
    assert before["status"] == "needs_review" and RENAMED in before["reason"], before
    done = review(root, "renamer", "--regrade")
    assert RENAMED in done.stdout
    after = export(root, tmp_path)[("renamer", LESSON.name)]
    assert (after["status"], after["reason"]) == (before["status"], before["reason"])


@pytest.mark.xdist_group("review")
def test_accepting_settles_a_flag_and_a_lesson_score_replaces_the_sum(course, tmp_path) -> None:
    review(course, "accepted", "--accept")
    review(course, "totalled", "--total", "9.5", "--note", "partial credit by hand")
    rows = export(course, tmp_path)
    accepted, totalled = rows[("accepted", LESSON.name)], rows[("totalled", LESSON.name)]
    assert (float(accepted["score"]), accepted["status"], accepted["review"]) == \
        (FULL, "graded", "accepted")
    assert (float(totalled["score"]), float(totalled["computed_score"])) == \
        (9.5, FULL - POINTS["machine_epsilon"])
    review(course, "totalled", "--clear-total")
    rows = export(course, tmp_path)
    assert float(rows[("totalled", LESSON.name)]["score"]) == FULL - POINTS["machine_epsilon"]
    listed = review(course).stdout
    assert "3 flagged of 6" in listed
    assert "[accepted]" in next(x for x in listed.splitlines() if x.strip().startswith("accepted"))


def test_the_log_replays_to_the_decisions_in_force() -> None:
    def row(action: str, exercise: str = "", points: float | None = None) -> dict:
        return {"lesson": "L", "student_id": "s", "action": action, "exercise": exercise,
                "points": points, "computed": None, "note": "", "by": "me", "at": 1.0,
                "notebook_sha256": ""}

    state = replay([row("set", "a", 1), row("set", "b", 2), row("clear", "a"),
                    row("total", points=5)])[("L", "s")]
    assert set(state.overrides) == {"b"} and state.total.points == 5 and state.resolved
    state = replay([row("set", "a", 1), row("accept"), row("discard"),
                    row("note")])[("L", "s")]
    assert not state.overrides and state.accepted is None and not state.resolved
    assert len(state.history) == 4


def stubbed(tmp_path: Path, rows: list[dict]):
    """A course whose grades are ``rows`` (the review log is real: SQLite in tmp_path)."""
    from grader.course import Course

    said: list[str] = []
    course = Course(tmp_path / "course", log=said.append)
    course.grades = lambda: [copy.deepcopy(r) for r in rows]
    course.statuses = lambda lesson=None: {LESSON.name: {
        str(r["student_id"]): {"status": r["computed_status"], "reason": r["reason"],
                               "notebook_sha256": "ab12", "handin": {"name": r["name"]}}
        for r in rows}}
    return course, said


def flag(student: str, status: str, reason: str, name: str = "", **late) -> dict:
    return {"student_id": student, "lesson": LESSON.name, "score": 12.0, "max_score": FULL,
            "status": status, "computed_status": status, "reason": reason, "name": name,
            "computed_score": 12.0, "exercises": {}, "review": "", "late_note": "", **late}


RENAMED = f"graded float_formats (1).ipynb in place of {NOTEBOOK}"


def test_accept_all_settles_only_the_flags_whose_every_reason_is_the_expected_one(
        tmp_path) -> None:
    from grader.common.errors import CourseError
    from grader.gradebook.decisions import states
    from grader.gradebook.review import accept_all

    course, said = stubbed(tmp_path, [
        flag("renamed", "needs_review", RENAMED, "Ada Lovelace"),
        flag("renamed2", "needs_review", RENAMED.replace("(1)", "(2)")),
        flag("both", "needs_review", f"{RENAMED}; code reaches for the file system"),
        flag("files", "needs_review", "code reaches for the file system"),
        flag("broken", "invalid", f"no notebook {NOTEBOOK} in the submission ({RENAMED})"),
        flag("fine", "graded", "")])
    assert accept_all(course, LESSON, "  IN PLACE   of ", None, "prof_x") == 2
    decided = states(course.db_url, LESSON.name)
    assert {s for (_, s), state in decided.items() if state.accepted} == {"renamed", "renamed2"}
    assert decided[(LESSON.name, "renamed")].accepted.by == "prof_x"
    assert "accepted the computed score of 2" in said[-1]
    assert "renamed (Ada Lovelace)" in said[-1]  # the name beside the id
    assert "left open, another reason besides (or invalid): both, broken" in said[-1]
    with pytest.raises(CourseError, match=r"no open needs_review flag.*the open reasons are"):
        accept_all(course, LESSON, "no such reason", None, "prof_x")
    with pytest.raises(CourseError, match="would match almost any reason"):
        accept_all(course, LESSON, ["file system", "s"], None, "prof_x")
    # each of "both"'s reasons is one of them now (the stub's grades stay as they were, so
    # the two accepted above are counted again)
    assert accept_all(course, LESSON, ["file system", "in place of"], None, "prof_x") == 4
    decided = states(course.db_url, LESSON.name)
    assert {s for (_, s), state in decided.items() if state.accepted} == {
        "renamed", "renamed2", "both", "files"}
    root = tmp_path / "cli"
    for args in (("--accept-all",), ("--reason", "x"), ("s1", "--accept-all", "--reason", "x"),
                 ("--accept-all", "--reason", "x", "--set", "decode=1")):
        done = command("review", LESSON.name, *args, "--course-dir", root, check=False)
        assert done.returncode == 2 and "--accept-all goes with --reason" in done.stderr, args


def test_review_shows_names_beside_ids_and_the_late_penalty(tmp_path) -> None:
    from grader.gradebook.review import flagged, show

    course, said = stubbed(tmp_path, [
        flag("late", "needs_review", "code reaches for the file system", "Ada \x1b[2JLovelace",
             raw_score=15.0, late_penalty=3.0, score=12.0, late=False,
             late_note="1 d 2 h 0 min late: -20%", time_source="Moodle's grading worksheet"),
        flag("marked", "needs_review", RENAMED, "Rick Roe", late=True,
             late_note="marked late by the LMS, time unknown: no penalty (it may lie within the "
                       "5-minute grace)", time_source="Canvas's LATE mark")])
    flagged(course, LESSON)
    listed = said[-1]
    assert "late (Ada \\x1b[2JLovelace)" in listed and "\x1b" not in listed
    assert "late: 1 d 2 h 0 min late: -20%; 15 - 3 = 12 (Moodle's grading worksheet)" in listed
    assert "marked (Rick Roe)" in listed and "it may lie within the 5-minute grace" in listed
    show(course, LESSON, "late")
    assert said[-1].startswith("late (Ada \\x1b[2JLovelace), 01_float_formats: needs_review")
    assert "late: 1 d 2 h 0 min late: -20%; 15 - 3 = 12" in said[-1]


# ------------------------------------------------------------------ PostgreSQL

@pytest.mark.xdist_group("review-postgres")
def test_review_decisions_live_in_a_postgres_gradebook(postgres_database, tmp_path) -> None:
    url = postgres_database  # on the test run's PostgreSQL server
    root = tmp_path / "course"
    grader("release", LESSON.name, "--course-dir", root, "--db-url", url)
    folder = tmp_path / "class"
    wrong = read_notebook(LESSON.notebook)
    cell(wrong, "machine_epsilon").source = FLAGGED_EPSILON
    submit(folder, "pg_student", wrong, NOTEBOOK)
    grader("autograde", LESSON.name, folder, "--course-dir", root, "--db-url", url)
    command("review", LESSON.name, "pg_student", "--set", "machine_epsilon=1", "--note", "ok",
            "--course-dir", root, "--db-url", url)
    path = tmp_path / "grades.csv"
    command("export", "--course-dir", root, "--db-url", url, "--csv", path)
    row = read_export(path)[("pg_student", LESSON.name)]
    assert (float(row["score"]), float(row["computed_score"]), row["status"]) == \
        (FULL, FULL - 1, "graded")
    assert [r["action"] for r in ledger.read_decisions(url, LESSON.name)] == ["set"]
    assert not (root / "gradebook.db").exists()
