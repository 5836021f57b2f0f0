"""Each student's own variant: the course key and the draw (grader/gradebook/variants.py)."""

from __future__ import annotations

import os
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grader.common.errors import CourseError
from grader.gradebook.variants import KEY_BYTES, KEY_FILE, course_key, draw, seed

KEY = bytes(range(KEY_BYTES))
IDS = st.text(min_size=1, max_size=40)


@given(key=st.binary(min_size=KEY_BYTES, max_size=KEY_BYTES), student=IDS,
       count=st.integers(1, 12))
def test_a_student_always_draws_the_same_variant_and_one_that_exists(key, student, count) -> None:
    got = draw(key, "05_adamw_memory", "predicted_mlp_training_bytes", student, count)
    assert 0 <= got < count
    assert got == draw(key, "05_adamw_memory", "predicted_mlp_training_bytes", student, count)


def test_a_class_spreads_over_the_variants_and_each_exercise_draws_apart() -> None:
    students = [f"s{i:03d}" for i in range(400)]
    spread = Counter(draw(KEY, "01_float_formats", "predicted_bf16_stall", s, 4) for s in students)
    assert set(spread) == {0, 1, 2, 3} and min(spread.values()) >= 70  # about 100 each
    same = sum(draw(KEY, "01_float_formats", "a", s, 4) == draw(KEY, "01_float_formats", "b", s, 4)
               for s in students)
    assert 60 <= same <= 140  # independent draws agree one time in four


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
