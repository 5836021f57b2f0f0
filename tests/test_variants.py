"""Each student's own variant: the course key and the draw (grader/content/variants.py)."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grader.common.errors import CourseError
from grader.content.variants import KEY_BYTES, KEY_FILE, course_key, draw, fingerprint, seed

KEY = bytes(range(KEY_BYTES))
IDS = st.text(min_size=1, max_size=40)


@given(key=st.binary(min_size=KEY_BYTES, max_size=KEY_BYTES), student=IDS,
       count=st.integers(1, 12))
def test_a_student_always_draws_the_same_variant_one_that_exists_and_never_the_default(
        key, student, count) -> None:
    """The default (0) is what the cells after a prediction measure: no student with an id
    answers it, unless it is the only variant."""
    got = draw(key, "05_adamw_memory", "predicted_mlp_training_bytes", student, count)
    assert (1 <= got < count) if count > 1 else got == 0
    assert got == draw(key, "05_adamw_memory", "predicted_mlp_training_bytes", student, count)


def test_a_class_spreads_over_the_other_variants_and_each_exercise_draws_apart() -> None:
    students = [f"s{i:03d}" for i in range(400)]
    spread = Counter(draw(KEY, "01_float_formats", "predicted_bf16_stall", s, 5) for s in students)
    assert set(spread) == {1, 2, 3, 4} and min(spread.values()) >= 70  # about 100 each
    same = sum(draw(KEY, "01_float_formats", "a", s, 5) == draw(KEY, "01_float_formats", "b", s, 5)
               for s in students)
    assert 60 <= same <= 140  # independent draws agree one time in four


def test_every_graded_prediction_has_its_default_and_four_others_and_codes_never_the_default(
        ) -> None:
    """design42: a class spreads over at least 4 variants besides the default, and a code, which
    carries a student's draws to a lab of their own, never holds the default's digit."""
    from grader.content.lessons import all_lessons
    from grader.content.variants import (
        LEAST_OTHER_CHOICES,
        Variants,
        code_variants,
        lesson_draw,
        student_code,
        variants_of,
    )

    assert LEAST_OTHER_CHOICES == 4
    for lesson in all_lessons():
        for name, spec in variants_of(lesson).items():
            assert len(spec.choices) >= 5, (lesson.name, name)
            drawn = {lesson_draw(KEY, lesson, f"s{i:02d}").variants[name] for i in range(60)}
            assert drawn == set(range(1, len(spec.choices))), (lesson.name, name)
    with pytest.raises(ValueError, match="at least 4 other choices"):
        Variants(("x",), ((1,), (2,), (3,), (4,)), "{x}")
    code = student_code(KEY, "s001")
    fingerprint_, digits = code.split("-")
    assert "0" not in digits
    drawn = json.loads(code_variants(code, "s001"))["draws"]
    assert all(index >= 1 for index in drawn.values())
    with pytest.raises(CourseError, match="not a code of this course"):
        code_variants(f"{fingerprint_}-{'0' * len(digits)}", "s001")


def test_without_the_key_the_draw_cannot_be_told() -> None:
    """Another key (a student guessing one) draws other variants for most of the class."""
    other = bytes(KEY_BYTES)
    students = [f"s{i:03d}" for i in range(200)]
    differ = sum(draw(KEY, "l", "e", s, 4) != draw(other, "l", "e", s, 4) for s in students)
    assert differ >= 120  # three in four
    assert len({seed(KEY, "l", "e", s) for s in students}) == len(students)
    assert all(0 <= seed(KEY, "l", "e", s) < 2**64 for s in students)


def test_at_least_one_variant() -> None:
    with pytest.raises(ValueError, match="at least one variant"):
        draw(KEY, "l", "e", "s", 0)


def test_the_key_is_made_once_for_its_owner_alone_and_kept(tmp_path) -> None:
    assert course_key(tmp_path) is None
    key = course_key(tmp_path, create=True)
    assert key is not None and len(key) == KEY_BYTES
    assert (tmp_path / KEY_FILE).stat().st_mode & 0o777 == 0o600
    assert course_key(tmp_path, create=True) == key == course_key(tmp_path)
    assert course_key(tmp_path / "another", create=True) != key


def test_a_damaged_or_readable_key_is_refused_saying_what_to_do(tmp_path) -> None:
    path = tmp_path / KEY_FILE
    path.write_bytes(b"short")
    os.chmod(path, 0o600)
    with pytest.raises(CourseError, match="restore it from a backup"):
        course_key(tmp_path, create=True)  # never replaced: the students' variants would change
    assert path.read_bytes() == b"short"
    path.write_bytes(bytes(KEY_BYTES))
    os.chmod(path, 0o644)
    with pytest.raises(CourseError, match="chmod 600"):
        course_key(tmp_path)


# ---------------------------------------------------------------- graded on one's own numbers

LESSON = "05_adamw_memory"
PREDICTION = "predicted_mlp_training_bytes"


def _ids_drawing(key: bytes, lesson, wanted: list[int]) -> list[str]:
    """Student ids that draw the variants ``wanted`` of the lesson's graded prediction, in order."""
    from grader.content.variants import variants_of

    count = len(variants_of(lesson)[PREDICTION].choices)
    found: list[str] = []
    for i in range(10_000):
        student = f"s{i:04d}"
        if len(found) < len(wanted) and draw(key, lesson.name, PREDICTION, student, count) \
                == wanted[len(found)] and student not in found:
            found.append(student)
    return found


def _recorded(nb, student: str | None, index: int, course: str = ""):
    """``nb`` as the lab saves it after its variant cell drew ``index`` for ``student`` with
    the key whose fingerprint is ``course``."""
    from nbformat.v4 import new_output

    from tests.grading_helpers import cell

    cell(nb, f"variant-{PREDICTION}").outputs = [new_output(
        "display_data", data={"text/plain": "Your numbers: ..."},
        metadata={"counting_the_cost": {"variant": {
            "exercise": f"{LESSON}/{PREDICTION}", "student": student, "index": index,
            "course": course}}})]
    return nb


@pytest.mark.slow
def test_each_student_is_graded_on_their_own_numbers_and_a_copy_earns_nothing(
        tmp_path, shared_tmp) -> None:
    """Four hand-ins of lesson 05 in one batch: two honest students on different variants
    (full marks, each with the answer for their own MLP on the feedback page); a copy of the
    first one's notebook handed in by a third student, and a notebook worked on the default
    numbers by a fourth whose own differ: both lose the prediction's point (and only it) and
    are flagged, saying why. Then report's pass rates by variant, and review."""
    import csv
    import html
    import re

    from grader.content.lessons import load_lesson
    from grader.grading.plans import variant_answer
    from tests.grading_helpers import (
        answered,
        cell,
        grader,
        read_export,
        read_notebook,
        released_course,
        submit,
    )

    lesson = load_lesson(LESSON)
    course = released_course([lesson], shared_tmp, tmp_path / "course")
    key = course_key(course)
    assert key is not None  # release made it, beside the gradebook, not in the release
    assert not any(KEY_FILE in str(p) for p in (course / "release").rglob("*"))
    first, second, copier, self_study = _ids_drawing(key, lesson, [1, 2, 3, 2])
    student = read_notebook(course / "release" / LESSON / lesson.notebook.name)
    folder = tmp_path / "in"
    for name, index in ((first, 1), (second, 2)):  # as their labs saved them
        submit(folder, name, _recorded(answered(student, lesson), name, index,
                                       fingerprint(key)), lesson.notebook.name)
    copied = answered(student, lesson)  # the first one's numbers, written in as a number
    cell(copied, PREDICTION).source = (f"{PREDICTION} = "
                                       f"{float(variant_answer(lesson, PREDICTION, 1))!r}")
    submit(folder, copier, _recorded(copied, first, 1), lesson.notebook.name)
    default = answered(student, lesson)
    cell(default, PREDICTION).source = (f"{PREDICTION} = "
                                        f"{float(variant_answer(lesson, PREDICTION, 0))!r}")
    submit(folder, self_study, _recorded(default, None, 0), lesson.notebook.name)

    grader("autograde", LESSON, folder, "--course-dir", course)
    grader("export", "--course-dir", course, "--csv", tmp_path / "grades.csv")
    rows = read_export(tmp_path / "grades.csv")
    scores = {s: float(rows[(s, LESSON)][f"{LESSON}/{PREDICTION}"])
              for s in (first, second, copier, self_study)}
    assert scores == {first: 1.0, second: 1.0, copier: 0.0, self_study: 0.0}
    totals = {s: float(rows[(s, LESSON)]["score"]) for s in scores}
    assert totals[first] == totals[second] == totals[copier] + 1 == totals[self_study] + 1
    assert [rows[(s, LESSON)]["status"] for s in scores] == [
        "graded", "graded", "needs_review", "needs_review"]
    status = json.loads((course / "grading_status.json").read_text())[LESSON]
    assert f"drawn for another student id, '{first}'" in status[copier]["reason"]
    assert "on the course's default numbers" in status[self_study]["reason"]

    grader("feedback", LESSON, "--course-dir", course)
    for name, index in ((first, 1), (second, 2), (copier, 3)):
        page = course / "feedback" / name / LESSON / f"{lesson.notebook_id}.html"
        text = " ".join(html.unescape(re.sub(r"<[^>]+>", "", page.read_text())).split())
        spec = variants_of_lesson(lesson)
        answer = f"{int(variant_answer(lesson, PREDICTION, index)):,}"
        assert f"the answer for your numbers ({spec.said(index)}) is {answer}" in text, name
        assert "(within 10%, as the check counts) earns the point" in text
        assert f"Your numbers (drawn for {name}): {spec.said(index)}" in text  # their MLP ran
    # Pass rates by variant count the scores after review, as exercises.csv does, and leave
    # out work on other numbers than the student's own (the copy, the defaults): they say
    # nothing of how hard a variant is.
    grader("review", LESSON, second, "--set", f"{PREDICTION}=0", "--note", "see me",
           "--course-dir", course)
    said = grader("report", LESSON, "--course-dir", course).stdout
    with (course / "reports" / LESSON / "variants.csv").open() as handle:
        by_variant = {int(r["variant"]): (int(r["passed"]), int(r["graded"]))
                      for r in csv.DictReader(handle)}
    assert by_variant == {0: (0, 0), 1: (1, 1), 2: (0, 1), 3: (0, 0), 4: (0, 0)}
    assert "not counted: 2 worked on other numbers than their own" in said
    shown = grader("review", LESSON, copier, "--course-dir", course).stdout
    assert f"the answer for your numbers ({variants_of_lesson(lesson).said(3)})" in shown

    # A new key for the numbers from now on: every key stays beside the course, and each
    # hand-in stays on the key its notebook records. --resume grades no one again, a regrade
    # of a notebook worked on the old key's numbers keeps its right prediction, and the pass
    # rates by variant are the same.
    old = key
    grader("release", LESSON, "--new-key", "--course-dir", course)
    new = course_key(course)
    assert new not in (None, old)
    assert (course / f"{KEY_FILE}.{fingerprint(old)}").read_bytes() == old
    assert (course / f"{KEY_FILE}.{fingerprint(new)}").read_bytes() == new
    done = grader("autograde", LESSON, folder, "--resume", "--course-dir", course)
    assert "4 skipped, graded already (--resume)" in done.stdout + done.stderr
    alone = tmp_path / "alone"
    (alone / first).mkdir(parents=True)
    (alone / first / lesson.notebook.name).write_bytes(
        (folder / first / lesson.notebook.name).read_bytes())
    grader("autograde", LESSON, alone, "--course-dir", course)  # graded again, not skipped
    grader("export", "--course-dir", course, "--csv", tmp_path / "again.csv")
    assert float(read_export(tmp_path / "again.csv")[(first, LESSON)][
        f"{LESSON}/{PREDICTION}"]) == 1.0
    grader("report", LESSON, "--course-dir", course)
    with (course / "reports" / LESSON / "variants.csv").open() as handle:
        assert {int(r["variant"]): (int(r["passed"]), int(r["graded"]))
                for r in csv.DictReader(handle)} == by_variant
    # A second --new-key in a row makes no third key unless given twice: students may hold
    # the new key's codes already. It says how to go back instead.
    done = grader("release", LESSON, "--new-key", "--course-dir", course, check=False)
    assert done.returncode == 2 and "give --new-key twice" in done.stderr, done.stderr
    assert f"--restore-key {course / KEY_FILE}.{fingerprint(old)}" in done.stderr
    assert course_key(course) == new
    # The old key restored from a backup over variants.key: taken back (not refused for
    # good), the new one kept; and back again with --restore-key. A key the course never had
    # is refused, and changes nothing.
    (course / KEY_FILE).write_bytes(old)
    said = grader("variants", first, "--course-dir", course).stdout
    assert "is the key this course had before" in said
    assert said.splitlines()[-1].startswith(f"{first}\t{fingerprint(old)}-")
    grader("release", "--restore-key", course / f"{KEY_FILE}.{fingerprint(new)}",
           "--course-dir", course)
    assert course_key(course) == new
    stranger = tmp_path / "stranger.key"
    stranger.write_bytes(bytes(KEY_BYTES))
    done = grader("release", "--restore-key", stranger, "--course-dir", course, check=False)
    assert done.returncode == 2 and "was never this course's key" in done.stderr
    assert course_key(course) == new
    done = grader("autograde", LESSON, folder, "--resume", "--course-dir", course)
    assert "4 skipped, graded already (--resume)" in done.stdout + done.stderr


def variants_of_lesson(lesson):
    from grader.content.variants import variants_of

    return variants_of(lesson)[PREDICTION]


def test_two_students_meet_their_own_hidden_inputs_and_the_kernel_sees_no_seed() -> None:
    from grader.content.lessons import load_lesson
    from grader.content.variants import lesson_draw
    from grader.grading.plans import plan_for
    from grader.grading.probe import exercises

    lesson = load_lesson(LESSON)

    def hidden(student: str | None, key: bytes | None = KEY) -> list[str]:
        plan = plan_for(lesson, lesson_draw(key, lesson, student))
        [memory] = [e for e in plan if e.name == "training_memory"]
        return [c.expression for c in memory.checks]

    base = [c.expression for e in exercises(lesson) if e.name == "training_memory"
            for c in e.checks]
    ana, ben = hidden("ana"), hidden("ben")
    assert ana[:len(base)] == base == ben[:len(base)]  # the fixed corner cases, for everyone
    assert len(ana) == len(base) + 3 and ana[len(base):] != ben[len(base):]
    assert hidden("ana") == ana  # the same id, the same inputs
    assert hidden("ana", key=None) == base  # no key: the defaults, nothing drawn
    draw_ = lesson_draw(KEY, lesson, "ana")
    assert set(json.loads(draw_.environment()["CTC_VARIANTS"])) == {"student", "course", "draws"}
    assert str(draw_.seeds["training_memory"]) not in draw_.environment()["CTC_VARIANTS"]


@settings(deadline=None)  # the first example imports torch (the checks' comparison)
@given(answer=st.floats(1e-3, 1e15), tolerance=st.sampled_from([0.01, 0.05, 0.1, 0.25]),
       ratio=st.floats(0.5, 1.5))
def test_the_feedback_says_inside_exactly_when_the_point_is_given(answer, tolerance,
                                                                  ratio) -> None:
    """The band a graded prediction's feedback shows is the one its check applies
    (math.isclose: within the tolerance of the larger number), and every number it shows as
    an end of the band earns the point."""
    import re

    from grader.content.notebook_checks import readable
    from grader.grading.probe import Check, Exercise, judge

    exercise = Exercise("p", 1.0, [Check("float(p)", answer, tolerance, 0.0, True)],
                        prediction=True)
    verdict = judge(exercise, [answer * ratio])
    assert ("is inside it" in verdict.told) == (verdict.points == 1.0), verdict.told
    low, high = re.search(r"from (\S+) to (\S+) \(within", verdict.told).groups()
    assert readable(answer) in verdict.told
    if answer >= 1000:  # the ends shown are whole numbers inside the band
        for end in (low, high):
            assert judge(exercise, [float(end.replace(",", ""))]).points == 1.0, verdict.told


def test_a_notebook_worked_on_other_numbers_gets_one_reason_saying_which() -> None:
    """Each way a notebook's numbers can differ from its student's is named, once per
    exercise however many records a notebook holds (it cannot bury the grader's other
    reasons), and a notebook of the student's own numbers gets none."""
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from grader.content.lessons import load_lesson
    from grader.content.variants import lesson_draw
    from grader.grading.autograde import drawn_elsewhere

    lesson = load_lesson(LESSON)
    own = lesson_draw(KEY, lesson, "ana")
    index = own.variants[PREDICTION]

    def notebook(*records) -> object:
        outputs = [new_output("display_data", data={"text/plain": "..."}, metadata={
            "counting_the_cost": {"variant": {"exercise": f"{LESSON}/{PREDICTION}",
                                              "student": who, "index": i, "course": course}}})
            for who, i, course in records]
        return new_notebook(cells=[new_code_cell("", outputs=outputs)])

    assert drawn_elsewhere(notebook(("ana", index, own.course)), lesson, own) == []
    assert drawn_elsewhere(notebook(), lesson, own) == []  # cleared: nothing to tell
    forged = notebook(*((f"s{i}", index, own.course) for i in range(3000)))
    [reason] = drawn_elsewhere(forged, lesson, own)
    assert "another student id, 's0' (and 49 more)" in reason  # 50 records read at most
    other = (index + 1) % len(variants_of_lesson(lesson).choices)
    [reason] = drawn_elsewhere(notebook(("ana", other, "0" * 12)), lesson, own)
    assert "with another course's key" in reason
    [reason] = drawn_elsewhere(notebook(("ana", other, own.course)), lesson, own)
    assert "as another variant than the course draws" in reason
    [reason] = drawn_elsewhere(notebook((None, other, "")), lesson, own)
    assert "the course's default numbers" in reason
    assert drawn_elsewhere(forged, lesson, lesson_draw(None, lesson, "ana")) == []  # no key


@settings(deadline=None, max_examples=40)
@given(seed_value=st.integers(0, 2**64 - 1))
def test_every_lessons_drawn_cases_are_answered_by_the_reference(seed_value) -> None:
    """Whatever a student's seed, each drawn hidden case is valid input the reference answers
    (or refuses as the case says): grading never meets a draw it cannot judge."""
    from grader.content.cases import as_case
    from grader.content.lessons import all_lessons
    from grader.content.variants import drawn_cases, drawn_of
    from grader.grading.plans import _expected, reference_namespace

    for lesson in all_lessons():
        namespace = reference_namespace(lesson)
        for exercise in drawn_of(lesson):
            cases = drawn_cases(lesson, exercise, seed_value)
            assert len(cases) == 3, (lesson.name, exercise)
            for case in map(as_case, cases):
                _expected(case, namespace)  # raises CourseError for a draw it cannot answer
