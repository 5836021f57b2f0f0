"""The student's `make lab`, headless: the server starts, lists every lesson, Validate answers."""

from __future__ import annotations

import pytest

from grader.lessons import all_lessons
from tests.grading_helpers import grader


@pytest.mark.slow
def test_lab_smoke_lists_every_lesson_and_keeps_the_students_work(tmp_path) -> None:
    workspace, course = tmp_path / "workspace", tmp_path / "course"
    done = grader("lab", "--smoke", "--workspace", workspace, "--course-dir", course)
    for lesson in all_lessons():
        assert lesson.name in done.stdout
        mine = workspace / lesson.name / lesson.notebook.name
        assert "raise NotImplementedError()" in mine.read_text()  # the student version
    assert "Validate ran on" in done.stdout

    # The student's edits survive a second start; a deleted lesson comes back.
    first = all_lessons()[0]
    mine = workspace / first.name / first.notebook.name
    mine.write_text(mine.read_text().replace("raise NotImplementedError()", "return 42", 1))
    done = grader("lab", "--smoke", "--workspace", workspace, "--course-dir", course)
    assert "return 42" in mine.read_text()
    assert f"kept your {first.name}/{first.notebook.name}" in done.stdout
