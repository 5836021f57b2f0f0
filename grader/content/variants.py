"""Each student's own numbers: a course key, a draw from it, and what a lesson lets vary.

A course's key is 32 random bytes in ``<course-dir>/variants.key`` (mode 0600), made once (by
the first ``release``, once the lessons draw variants) and kept for the life of the course. A
student's variant of an exercise is HMAC-SHA256(key, "LESSON/EXERCISE/STUDENT") read as a
number, modulo the number of variants: the same id always draws the same variant, in the lab,
at grading, in review and feedback, and without the key no one can tell which variant another
id draws. The key lives beside the gradebook; nothing under ``release/`` or ``source/`` (what
students receive) holds it.

HMAC rather than a plain hash of the id: the ids are known (a class list), so a plain hash
would let anyone compute every student's variant. ``seed`` gives the same kind of number for
drawing a student's own hidden-check inputs.

What varies is the lesson's to say, in its cases module (grader/content/cases/):
``VARIANTS[exercise]`` (a ``Variants``) lists the numbers a graded prediction may ask about, the
first being the one the notebook's prose and a student without an id answer. A student graded
under a course key never draws that first one: the cells after a prediction measure the
default's numbers (never the student's own, whose answer they would print), so every student
with an id answers numbers no cell of the notebook works out for them. ``DRAWN[exercise]``
is a function of a ``random.Random`` that returns hidden cases with inputs of the student's own.
A student's ``Draw`` for a lesson says which variant of each prediction they answer and seeds
their drawn cases. The lab and the grading kernel learn the variants (never the key or the
seeds) from the environment variable ``CTC_VARIANTS``; the notebook's variant cell reads it.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from grader.common.errors import CourseError
from grader.common.keys import KEY_BYTES as KEY_BYTES  # its size, named here too
from grader.common.keys import key_file
from grader.content.lessons import Lesson, all_lessons

KEY_FILE = "variants.key"
# The kernel's variants: {"student": ID, "course": FINGERPRINT, "draws": {"LESSON/EXERCISE": N}}
ENV = "CTC_VARIANTS"


def course_key(root: Path, create: bool = False) -> bytes | None:
    """The course's key, read from ``root``/variants.key; made there first with ``create``
    (None without it when there is none yet). A key file that is not a plain file of 32 bytes
    readable by its owner alone is refused: grading with another key would give every student
    other questions. (grader/gradebook/coursestate.py checks it against the gradebook's.)"""
    return key_file(root / KEY_FILE, create, "the course's key",
                    "restore it from a backup of the course directory; a new key would give "
                    "every student other variants")


def canonical(student_id: str) -> str:
    """A student id as numbers are drawn for it: an e-mail in lower case (one address however
    it is typed: the roster's "Anna.M@Uni.de" and the lab's "anna.m@uni.de" are one student),
    any other id as it is."""
    return student_id.strip().lower() if "@" in student_id else student_id


def _number(key: bytes, lesson: str, exercise: str, student_id: str) -> int:
    message = "/".join((lesson, exercise, canonical(student_id))).encode()
    return int.from_bytes(hmac.new(key, message, hashlib.sha256).digest(), "big")


def draw(key: bytes, lesson: str, exercise: str, student_id: str, count: int) -> int:
    """The variant of ``exercise`` that ``student_id`` answers: 1 to ``count`` - 1, never the
    default (0), whose answer the notebook's measurement shows (0 only when it is the one
    variant). With 256 bits drawn, reducing modulo a small count leaves no bias worth a thought
    (under 2**-240)."""
    if count < 1:
        raise ValueError(f"an exercise has at least one variant, got {count}")
    if count == 1:
        return 0
    return 1 + _number(key, lesson, exercise, student_id) % (count - 1)


def seed(key: bytes, lesson: str, exercise: str, student_id: str) -> int:
    """A 64-bit seed of the student's own for ``exercise`` (its hidden checks' drawn inputs)."""
    return _number(key, lesson, f"{exercise}#seed", student_id) >> 192


# A graded prediction's choices besides the default: enough that a class spreads over them.
LEAST_OTHER_CHOICES = 4


@dataclass(frozen=True)
class Variants:
    """The numbers a graded prediction may ask about: ``names`` bound, in each of ``choices``,
    to a tuple of values (the first choice is the default, which no student with an id draws;
    at least ``LEAST_OTHER_CHOICES`` others), and ``words``, a format string that says a choice
    in plain words (``"Linear({widths[0]}, {widths[1]})"``)."""

    names: tuple[str, ...]
    choices: tuple[tuple, ...]
    words: str

    def __post_init__(self) -> None:
        if not self.choices or any(len(c) != len(self.names) for c in self.choices):
            raise ValueError(f"each choice binds every one of {self.names}")
        if len(self.choices) < 1 + LEAST_OTHER_CHOICES:
            raise ValueError(f"a graded prediction has its default and at least "
                             f"{LEAST_OTHER_CHOICES} other choices, got {len(self.choices)} "
                             "in all")
        self.words.format(**self.bound(0))  # a name the words use and no choice binds: now

    def bound(self, index: int) -> dict[str, object]:
        return dict(zip(self.names, self.choices[index], strict=True))

    def said(self, index: int) -> str:
        return self.words.format(**self.bound(index))


@dataclass(frozen=True)
class Draw:
    """One student's draws for one lesson: the variant of each graded prediction (by index
    into its choices), and a seed for each exercise with drawn hidden inputs. ``student`` is
    None for a course without a key: everyone answers the defaults, with no drawn inputs."""

    lesson: str
    student: str | None
    variants: dict[str, int] = field(default_factory=dict)
    seeds: dict[str, int] = field(default_factory=dict)
    course: str = ""  # the fingerprint of the key it was drawn with
    group: tuple[str, ...] = ()  # a group hand-in: every member's course id (``student`` one)

    def environment(self) -> dict[str, str]:
        """What the grading kernel is started with: the variants, not the seeds."""
        return {ENV: kernel_variants(self.student, {self.lesson: self.variants}, self.course)}


def variants_of(lesson: Lesson) -> dict[str, Variants]:
    """The lesson's graded predictions that vary, by exercise."""
    return dict(getattr(importlib.import_module(lesson.cases), "VARIANTS", {}))


def drawn_of(lesson: Lesson) -> dict[str, Callable[[random.Random], list]]:
    """The lesson's exercises with hidden inputs drawn per student."""
    return dict(getattr(importlib.import_module(lesson.cases), "DRAWN", {}))


def lesson_draw(key: bytes | None, lesson: Lesson, student: str) -> Draw:
    """What ``student`` answers in ``lesson`` under the course's ``key`` (defaults without one)."""
    if key is None:
        return Draw(lesson.name, None)
    student = canonical(student)
    variants = {name: draw(key, lesson.name, name, student, len(spec.choices))
                for name, spec in variants_of(lesson).items()}
    seeds = {name: seed(key, lesson.name, name, student) for name in drawn_of(lesson)}
    return Draw(lesson.name, student, variants, seeds, fingerprint(key))


def fingerprint(key: bytes) -> str:
    """A short name for the key, which tells nothing of it: what a notebook records of the
    course its numbers were drawn for, so that grading can tell a lab run with another key."""
    return hmac.new(key, b"fingerprint", hashlib.sha256).hexdigest()[:12]


def drawn_cases(lesson: Lesson, exercise: str, seed_value: int) -> list:
    """The hidden cases of ``exercise`` drawn from ``seed_value``."""
    return list(drawn_of(lesson)[exercise](random.Random(seed_value)))


def kernel_variants(student: str | None, draws: dict[str, dict[str, int]],
                    course: str = "") -> str:
    """The value of ``CTC_VARIANTS``: the student's id, each lesson's drawn variants and the
    fingerprint of the key they were drawn with."""
    return json.dumps({"student": student if student is None else canonical(student),
                       "course": course, "draws": {
        f"{lesson}/{exercise}": index for lesson, by_exercise in sorted(draws.items())
        for exercise, index in sorted(by_exercise.items())}}, sort_keys=True)


def lab_variants(key: bytes, student: str, lessons: list[Lesson] | None = None) -> str:
    """``CTC_VARIANTS`` for a student's lab: their variants in every lesson."""
    return kernel_variants(student, {
        lesson.name: lesson_draw(key, lesson, student).variants
        for lesson in (all_lessons() if lessons is None else lessons)}, fingerprint(key))


# A student's code: their numbers for a lab of their own, without the key. The key's fingerprint,
# then one base-36 digit per graded prediction that varies (every lesson's, in order).
CODE = re.compile(r"([0-9a-f]{12})-([0-9a-z]+)")
DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def varying_predictions(lessons: list[Lesson] | None = None
                        ) -> list[tuple[Lesson, str, Variants]]:
    """Every graded prediction that varies, lesson by lesson: one digit of a code each."""
    return [(lesson, name, spec) for lesson in (all_lessons() if lessons is None else lessons)
            for name, spec in sorted(variants_of(lesson).items())]


def student_code(key: bytes, student: str,
                 varying: list[tuple[Lesson, str, Variants]] | None = None) -> str:
    """The code that gives ``student``'s lab their numbers in every lesson: what an instructor
    hands a student who works on a machine of their own (the key stays with the course).
    ``varying``: ``varying_predictions()``, read once for a class's codes."""
    varying = varying_predictions() if varying is None else varying
    digits = "".join(DIGITS[draw(key, lesson.name, name, student, len(spec.choices))]
                     for lesson, name, spec in varying)
    return f"{fingerprint(key)}-{digits}"


def code_variants(code: str, student: str) -> str:
    """``CTC_VARIANTS`` from a student's code (``student_code``); a code that is not one, or is
    one of another version of the course, is refused, saying what to do."""
    varying = varying_predictions()
    found = CODE.fullmatch(code.strip().lower())
    if found is None or len(found.group(2)) != len(varying) or any(
            not 1 <= DIGITS.index(d) < len(spec.choices)  # never the default: see draw
            for d, (_, _, spec) in zip(found.group(2), varying, strict=True)):
        raise CourseError(f"{code!r} is not a code of this course's version (it has "
                          f"{len(varying)} numbers to draw): copy it again from your "
                          "instructor, or ask for a new one")
    draws: dict[str, dict[str, int]] = {}
    for digit, (lesson, name, _) in zip(found.group(2), varying, strict=True):
        draws.setdefault(lesson.name, {})[name] = DIGITS.index(digit)
    return kernel_variants(student, draws, found.group(1))
