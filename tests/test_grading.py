"""Release and grading end to end, through the instructor's commands and nbgrader's gradebook.

For every lesson: the instructor version submitted as a student scores full marks; the untouched
student version scores 0; one exercise answered wrongly loses exactly that exercise's points,
and in the same notebook another exercise's correct code that writes to stderr keeps its points
(one submission for both: a grading of a lesson costs seconds).
"""

from __future__ import annotations

import contextlib
import copy
import html
import importlib
import json
import re
import warnings
import zipfile
from pathlib import Path

import pytest

from grader.content.lessons import all_lessons
from tests.grading_helpers import (
    WRONG_ANSWERS,
    at_solution_top,
    cell,
    grader,
    points,
    read_export,
    read_notebook,
    released_course,
    released_output,
    submit,
)

pytestmark = pytest.mark.slow

LESSONS = all_lessons()

# A function whose body can start with a warning; it is called by its test cell.
NOISY = {"01_float_formats": "decode", "02_tensors_and_strides": "contiguous_strides",
         "03_matmul_flops": "matmul_flops", "04_backprop_flops": "transformer_params",
         "05_adamw_memory": "training_memory", "06_training_step": "train_step_flops",
         "07_many_devices": "collective_bytes", "08_inference": "kv_cache_bytes",
         "09_experts": "moe_params", "10_budget": "chinchilla_loss"}


def test_every_lesson_has_a_wrong_answer() -> None:
    assert {lesson.name for lesson in LESSONS} <= set(WRONG_ANSWERS) & set(NOISY)


# One xdist group per lesson: a worker grades a lesson once, and lessons grade in parallel.
@pytest.fixture(scope="module", ids=lambda lesson: lesson.name, params=[
    pytest.param(lesson, marks=pytest.mark.xdist_group(lesson.name)) for lesson in LESSONS])
def graded(request, tmp_path_factory, shared_tmp):
    """Release one lesson (the session's release, made by `grader release`), grade three
    submissions, export; return what came out."""
    lesson = request.param
    tmp = tmp_path_factory.mktemp(lesson.name)
    course = released_course([lesson], shared_tmp, tmp / "course")
    assert "released" in released_output(lesson, shared_tmp)
    student_nb = course / "release" / lesson.name / lesson.notebook.name
    instructor = read_notebook(lesson.notebook)

    submissions = tmp / "submissions"
    submit(submissions, "instructor", instructor, lesson.notebook.name)
    submit(submissions, "untouched", read_notebook(student_nb), lesson.notebook.name)

    wrong = copy.deepcopy(instructor)  # one exercise wrong, another correct and noisy
    name, source = WRONG_ANSWERS[lesson.name]
    cell(wrong, name).source = source
    target = cell(wrong, NOISY[lesson.name])
    target.source = at_solution_top(target.source, "import sys, warnings",
                                    "print('debug output', file=sys.stderr)",
                                    "warnings.warn('a harmless warning')")
    submit(submissions, "one_wrong", wrong, lesson.notebook.name)

    done = grader("autograde", lesson.name, submissions, "--course-dir", course)
    grader("export", "--course-dir", course, "--csv", tmp / "grades.csv")
    return {
        "lesson": lesson,
        "course": course,
        "student_nb": student_nb,
        "autograde": done,
        "grades": read_export(tmp / "grades.csv"),
        # what the grader recorded of each submission, as it was after this batch
        "status": json.loads((course / "grading_status.json").read_text())[lesson.name],
        "points": points(instructor),
    }


def score(graded, student: str) -> tuple[float, float, str]:
    row = graded["grades"][(student, graded["lesson"].name)]
    return float(row["score"]), float(row["max_score"]), row["status"]


def test_student_version_has_no_solutions_and_no_hidden_tests(graded) -> None:
    student = read_notebook(graded["student_nb"])
    text = "\n".join(c.source for c in student.cells)
    assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text
    assert "raise NotImplementedError()" in text
    source = read_notebook(graded["lesson"].notebook)
    # The hidden checks include the exercise's own example (a visible check too): only those
    # the instructor version does not show must be missing from the student's.
    shown = {line for c in source.cells for line in
             c.source.split("### BEGIN HIDDEN TESTS")[0].splitlines()}
    hidden = [line for c in source.cells if "### BEGIN HIDDEN TESTS" in c.source
              for line in c.source.split("### BEGIN HIDDEN TESTS")[1].splitlines()
              if line.startswith("check(") and line not in shown]
    assert hidden and not any(line in text for line in hidden)


def _decoded(text: str) -> list[object]:
    """What a string literal may hide: itself, and its base64, zlib and JSON decodings."""
    import base64
    import binascii
    import zlib

    found: list[object] = [text]
    for step in range(3):
        more = []
        for item in found[-1:] if step else found:
            if isinstance(item, (str, bytes)):
                with contextlib.suppress(binascii.Error, ValueError):
                    more.append(base64.b64decode(item, validate=True))
                with contextlib.suppress(zlib.error, TypeError):
                    more.append(zlib.decompress(item))
                with contextlib.suppress(ValueError, TypeError):
                    more.append(json.loads(item))
        found += more
    return found


def test_the_release_holds_no_graded_answer_sealed_or_plain(graded) -> None:
    """Every string literal of the student version, decoded every way the course ever packed
    an answer (base64 over zlib over JSON), holds no graded prediction's answer, for any
    student's numbers; nor does any number written in its code."""
    import ast
    import math

    from grader.content.variants import variants_of
    from grader.grading.plans import variant_answer
    from tests.grading_helpers import graded_prediction

    lesson = graded["lesson"]
    name = graded_prediction(lesson)
    count = len(variants_of(lesson)[name].choices) if name in variants_of(lesson) else 1
    answers = [float(variant_answer(lesson, name, i)) if count > 1
               else float(getattr(importlib.import_module(lesson.module), name))
               for i in range(count)]
    values: list[object] = []
    for c in read_notebook(graded["student_nb"]).cells:
        if c.cell_type != "code":
            continue
        with contextlib.suppress(SyntaxError):
            for node in ast.walk(ast.parse(c.source)):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    values += _decoded(node.value)
                elif isinstance(node, ast.Constant) and type(node.value) in (int, float):
                    values.append(node.value)
    numbers = [v for v in values if type(v) in (int, float)]
    for text in (v for v in values if isinstance(v, str)):
        with contextlib.suppress(ValueError):
            numbers.append(float(text))
    assert len(values) > 50  # the checks' messages, and the sealed ungraded answers
    # A small whole answer (lesson 01's sums stop at 1, 4, 8 or 32) is written everywhere as
    # itself, and no check of the notebook's numbers can tell it from them: those lessons rely
    # on the graded check taking no answer (tests/test_notebooks.py, sealed_answers).
    answers = [a for a in answers if not (a.is_integer() and abs(a) < 100)]
    leaked = [v for v in numbers for a in answers if math.isclose(v, a, rel_tol=1e-9)]
    assert leaked == [], f"{name}'s answer is in the release: {leaked}"


def test_instructor_version_scores_full_marks(graded) -> None:
    got, maximum, status = score(graded, "instructor")
    assert maximum == sum(graded["points"].values()) > 0
    # If it fails: what the grader recorded, each exercise's failed checks (hidden ones too)
    # included; a string, which pytest shows whole.
    assert (got, status) == (maximum, "graded"), json.dumps(graded["status"]["instructor"])
    # Checks that passed only when they ran again (grader/grading/execute.py) cost nothing, but
    # the machine or the grader failed once: the test log says what the first run saw.
    again = {name: e["first_run"] for name, e in graded["status"]["instructor"]["exercises"].items()
             if e.get("first_run")}
    if again:
        warnings.warn(f"passed on a second run of their checks: {json.dumps(again)}", stacklevel=1)


def test_the_instructor_version_runs_clean_as_graded(graded) -> None:
    """As the grader ran it (autograde mode, in the sandbox): no cell raised, every exercise's
    visible checks passed, and the plots were made but not drawn (autograde without --plots:
    tests/test_feedback.py grades with it). (The lecture mode's run, plots drawn, is in
    tests/test_notebooks.py.)"""
    lesson = graded["lesson"]
    ran = read_notebook(graded["course"] / "autograded" / "instructor" / lesson.name
                        / lesson.notebook.name)
    outputs = [o for c in ran.cells for o in c.get("outputs", [])]
    assert [o for o in outputs if o.output_type == "error"] == []
    said = ["".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                    for o in c.get("outputs", [])) for c in ran.cells]
    passed = [text for text in said if "all visible checks passed" in text]
    recorded = [text for text in said if "recorded; graded when you hand in" in text]
    assert len(recorded) == 1  # the graded prediction: recorded, never said to pass
    assert len(passed) + len(recorded) == sum(
        1 for c in ran.cells if c.metadata.get("nbgrader", {}).get("solution"))
    assert not any("image/png" in o.get("data", {}) for o in outputs)
    figures = [o for o in outputs if re.fullmatch(r"<Figure size \d+x\d+ with \d+ Axes>",
                                                  o.get("data", {}).get("text/plain", ""))]
    assert len(figures) >= 2


def test_untouched_student_version_scores_zero(graded) -> None:
    got, maximum, status = score(graded, "untouched")
    assert (got, maximum, status) == (0.0, sum(graded["points"].values()), "graded")


def test_one_wrong_exercise_loses_exactly_its_points(graded) -> None:
    """And a visible check caught it: the student saw it fail before handing in (what
    Validate shows; tests/test_browser.py reads the dialog for lesson 01)."""
    name, _ = WRONG_ANSWERS[graded["lesson"].name]
    got, maximum, _ = score(graded, "one_wrong")
    assert got == maximum - graded["points"][name]
    assert graded["status"]["one_wrong"]["exercises"][name]["failures"], name


def test_correct_code_that_writes_to_stderr_keeps_its_points(graded) -> None:
    """The noisy exercise wrote to stderr as it ran, and only the wrong one lost points."""
    lesson = graded["lesson"]
    name, _ = WRONG_ANSWERS[lesson.name]
    assert NOISY[lesson.name] != name
    got, maximum, status = score(graded, "one_wrong")
    assert (got, status) == (maximum - graded["points"][name], "graded")
    ran = read_notebook(graded["course"] / "autograded" / "one_wrong" / lesson.name
                        / lesson.notebook.name)
    written = "".join(o.get("text", "") for c in ran.cells for o in c.get("outputs", [])
                      if o.get("name") == "stderr")
    assert "debug output" in written and "a harmless warning" in written


def test_reviews_and_reports_tables_keep_their_columns_for_every_exercise_name(
        graded, tmp_path) -> None:
    """One student's review and the lesson's report print a table row per exercise: its
    columns end where the header's do, however long the lesson's names (lesson 08's
    predicted_cache_bytes_after_generation, 38 characters, once pushed its row's out)."""
    lesson, course = graded["lesson"], graded["course"]
    shown = grader("review", lesson.name, "one_wrong", "--course-dir", course).stdout
    report = grader("report", lesson.name, "--course-dir", course, "--out", tmp_path).stdout
    names = set(graded["points"])
    for text, column in ((shown, "computed"), (report, "passed"), (report, "mean")):
        lines = text.splitlines()
        at = next(i for i, line in enumerate(lines)
                  if line.split()[:1] == ["exercise"] and f" {column} " in f"{line} ")
        end = lines[at].index(f" {column}") + len(column) + 1  # right-aligned under it
        rows = []
        for line in lines[at + 1:]:
            if not line.strip():
                break
            if line.split()[0] in names:
                rows.append(line)
        assert {row.split()[0] for row in rows} == names, (column, text)
        for row in rows:
            assert row[end - 1] != " " and row[end:end + 1] in (" ", ""), (column, lines[at], row)


def test_autograde_reports_every_submission(graded) -> None:
    assert "3 graded, 0 needs_review, 0 invalid of 3" in graded["autograde"].stdout


def test_the_release_holds_every_file_of_the_lesson_folder(graded) -> None:
    """A released lesson is self-contained: its data files and helper scripts (lesson 07's
    distributed_demos.py) go with the student version."""
    lesson = graded["lesson"]
    names = {p.name for p in lesson.folder.iterdir() if not p.name.startswith((".", "__"))}
    released = {p.name for p in graded["student_nb"].parent.iterdir()
                if not p.name.startswith((".", "__"))}
    assert names == released


def test_feedback_pages_show_scores_and_no_hidden_check(graded) -> None:
    lesson, course = graded["lesson"], graded["course"]
    grader("feedback", lesson.name, "--course-dir", course)
    cells = read_notebook(lesson.notebook).cells
    shown_elsewhere = "\n".join(c.source.split("### BEGIN HIDDEN TESTS")[0] for c in cells)
    hidden_only = [line.split("'")[1] for c in cells if "### BEGIN HIDDEN TESTS" in c.source
                   for line in c.source.split("### BEGIN HIDDEN TESTS")[1].splitlines()
                   if line.startswith("check('") and line.split("'")[1] not in shown_elsewhere]
    assert hidden_only
    for student in ("instructor", "untouched", "one_wrong"):
        page = course / "feedback" / student / lesson.name / f"{lesson.notebook_id}.html"
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
        assert "Score" in text and "(hidden checks, not shown" in text
        assert "BEGIN HIDDEN TESTS" not in text
        leaked = [expression for expression in hidden_only if expression in text]
        assert leaked == [], f"{student}'s feedback shows hidden checks: {leaked[:3]}"


def test_regrading_replaces_earlier_grades_and_bad_submissions_get_zero(graded, tmp_path) -> None:
    """The instructor's full-marks student resubmits garbage: no stale points survive."""
    lesson, course = graded["lesson"], graded["course"]
    submissions = tmp_path / "again"
    (submissions / "instructor").mkdir(parents=True)
    (submissions / "instructor" / lesson.notebook.name).write_text("{not json")
    (submissions / "nobody_home").mkdir()
    zipped = tmp_path / "lms.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        for file in submissions.rglob("*"):
            archive.write(file, Path("class") / file.relative_to(submissions))
    done = grader("autograde", lesson.name, zipped, "--course-dir", course)
    assert "0 graded, 0 needs_review, 2 invalid of 2" in done.stdout
    grader("export", "--course-dir", course, "--csv", tmp_path / "again.csv")
    rows = read_export(tmp_path / "again.csv")
    for student, reason in [("instructor", "not a readable notebook"),
                            ("nobody_home", "no notebook")]:
        row = rows[(student, lesson.name)]
        assert (float(row["score"]), row["status"]) == (0.0, "invalid")
        assert reason in row["reason"]
    status = json.loads((course / "grading_status.json").read_text())
    assert status[lesson.name]["instructor"]["status"] == "invalid"


def test_unsafe_zip_is_refused_whole(tmp_path) -> None:
    zipped = tmp_path / "evil.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("../escape/float_formats.ipynb", "{}")
    done = grader("autograde", LESSONS[0].name, zipped, "--course-dir", tmp_path / "c", check=False)
    assert done.returncode == 2 and "outside the archive" in done.stderr


def test_unknown_lesson_and_missing_folder_fail_with_a_clear_message(tmp_path) -> None:
    done = grader("release", "99_nothing", "--course-dir", tmp_path, check=False)
    assert done.returncode == 2 and "no lesson named '99_nothing'" in done.stderr
    assert LESSONS[0].name in done.stderr
    done = grader("autograde", LESSONS[0].name, tmp_path / "absent", "--course-dir", tmp_path,
                  check=False)
    assert done.returncode == 2 and "no such submissions folder" in done.stderr
