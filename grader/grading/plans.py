"""Each student's own plan: a lesson's exercises as one student is graded on them.

``probe.exercises`` gives every check's expected value for the course's default numbers. A
student with a ``Draw`` (grader/content/variants.py) answers their own variant of each graded
prediction, whose expected value comes from the lesson's reference code with the variant's
names rebound (the prediction's reference cell run again in that namespace), and meets hidden
checks with inputs drawn from their seed, added after the fixed ones. Everything is computed here,
outside the student's kernel, from the reference code.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import replace

from grader.common import syntax
from grader.common.errors import CourseError
from grader.content.cases import as_case, reference_raises, reference_value
from grader.content.lessons import Lesson
from grader.content.variants import Draw, drawn_cases, variants_of
from grader.grading.probe import Check, Exercise, Raises, exercises


def reference_namespace(lesson: Lesson, exercise: str | None = None,
                        index: int = 0) -> dict:
    """The reference module's names (with math and torch), and, for a graded prediction's
    variant ``index``, that variant's names bound and the prediction computed from them."""
    import torch  # here, not above: the commands that grade nothing never load it

    module = importlib.import_module(lesson.module)
    namespace = {**vars(module), "math": math, "torch": torch}
    if exercise is not None:
        spec = variants_of(lesson)[exercise]
        namespace.update(spec.bound(index))
        given = next(e.given for e in exercises(lesson) if e.name == exercise)
        syntax.execute(given, namespace)
    return namespace


def variant_answer(lesson: Lesson, exercise: str, index: int) -> object:
    """The value a graded prediction's variant ``index`` asks for."""
    return reference_namespace(lesson, exercise, index)[exercise]


def plan_for(lesson: Lesson, draw: Draw | None) -> tuple[Exercise, ...]:
    """The lesson's exercises as ``draw``'s student is graded on them."""
    base = exercises(lesson)
    if draw is None or draw.student is None:
        return base
    variants = variants_of(lesson)
    plan = []
    for exercise in base:
        checks = list(exercise.checks)
        index = draw.variants.get(exercise.name, 0)
        if exercise.name in variants and index:
            namespace = reference_namespace(lesson, exercise.name, index)
            checks = [replace(check, expected=_expected(as_case(check.expression), namespace))
                      if not isinstance(check.expected, Raises) else check
                      for check in checks]
        if exercise.name in draw.seeds:
            namespace = reference_namespace(lesson)
            for case in map(as_case, drawn_cases(lesson, exercise.name,
                                                 draw.seeds[exercise.name])):
                try:
                    expected = _expected(case, namespace)
                except CourseError:  # a draw the reference refuses: the draw's fault, never
                    continue  # the student's (tests/test_variants.py draws many to find one)
                checks.append(Check(case.expression, expected, case.rel_tol, case.abs_tol,
                                    hidden=True))
        asked = variants[exercise.name].said(index) if exercise.name in variants else ""
        plan.append(replace(exercise, checks=checks, asked=asked)
                    if checks != exercise.checks or asked != exercise.asked else exercise)
    return tuple(plan)


def _expected(case, namespace: dict) -> object:
    if case.raises is not None:
        reference_raises(case, namespace)
        return Raises(case.raises)
    return reference_value(case, namespace)
