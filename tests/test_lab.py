"""The student's `make lab`, headless: the server starts, lists every lesson, Validate answers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from grader.content.lessons import all_lessons
from tests.grading_helpers import REPO, grader, grader_env, released_course


@pytest.mark.slow
def test_lab_smoke_lists_every_lesson_and_keeps_the_students_work(tmp_path, shared_tmp) -> None:
    """The lab over a course whose lessons are released (the tests release each once; the
    workspace tests below see the lab release a lesson itself, as on a first `make lab`)."""
    workspace = tmp_path / "workspace"
    course = released_course(all_lessons(), shared_tmp, tmp_path / "course")
    # As in a student's environment (`make lab`): nothing of the grading or test groups can be
    # imported, by the command, its lab server or Validate's kernel (tests/lab_only/).
    lab_only = {**grader_env(), "PYTHONPATH": str(REPO / "tests" / "lab_only")}
    done = subprocess.run([sys.executable, "-m", "grader", "lab", "--smoke", "--workspace",
                           str(workspace), "--course-dir", str(course)], cwd=REPO, env=lab_only,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
    # There, a command of the instructor's that needs the grading tools says how to get them.
    worker = subprocess.run([sys.executable, "-m", "grader", "worker", "--broker",
                             "redis://127.0.0.1:1/0", "--queue-key", str(tmp_path / "none")],
                            cwd=REPO, env=lab_only, capture_output=True, text=True, timeout=120)
    assert worker.returncode == 2 and worker.stderr == (
        "error: worker needs celery, which a student's environment (make lab) leaves out: "
        "install the grading tools with  make setup  (or pip install -e '.[grade]')\n"), worker
    for lesson in all_lessons():
        assert lesson.name in done.stdout
        mine = workspace / lesson.name / lesson.notebook.name
        assert "raise NotImplementedError()" in mine.read_text()  # the student version
    assert "Validate ran on" in done.stdout
    from grader.content.notebook_checks import SET_YOUR_ID

    assert f"No student id is set: the lessons use the course's default numbers. {SET_YOUR_ID}" \
        in done.stdout  # `make lab` with no id: the one instruction

    # The student's edits survive a second start; a deleted lesson comes back.
    import nbformat
    from nbformat.v4 import new_output

    first = all_lessons()[0]
    mine = workspace / first.name / first.notebook.name
    mine.write_text(mine.read_text().replace("raise NotImplementedError()", "return 42", 1))
    worked = nbformat.read(mine, as_version=4)  # its variant cell ran without an id
    [variant] = [c for c in worked.cells if "variant_of" in c.metadata.get("course", {})]
    variant.outputs = [new_output("display_data", data={"text/plain": "Your numbers: ..."},
                                  metadata={"counting_the_cost": {"variant": {
                                      "exercise": f"{first.name}/predicted_bf16_stall",
                                      "student": None, "index": 0, "course": ""}}})]
    nbformat.write(worked, mine)
    done = grader("lab", "--smoke", "--workspace", workspace, "--course-dir", course,
                  "--student", "s-123")
    assert "return 42" in mine.read_text()
    assert "newer version" not in done.stdout  # the course did not change: nothing to say
    # The id given once reaches the kernels of Validate (run by the lab's own server).
    assert "your own numbers are drawn for student id s-123" in done.stdout
    assert "asks about the numbers drawn for s-123" in done.stdout
    # and the lab says that the copy worked on the defaults is not the student's, and what to do
    assert (f"{first.name}: This notebook was worked on other numbers than yours: its numbers "
            "are the course's default ones") in done.stdout


def test_the_student_id_is_given_once_and_refused_when_it_is_not_one(tmp_path) -> None:
    import json

    from grader.common.errors import CourseError
    from grader.content.variants import course_key, lab_variants
    from grader.course import Course
    from grader.lab.server import workspace_variants

    course, workspace = Course(tmp_path / "course", log=lambda _: None), tmp_path / "ws"
    assert workspace_variants(course, workspace) == {}  # no id: the defaults, nothing drawn
    given = workspace_variants(course, workspace, "ana.b@uni")
    assert given == {"CTC_VARIANTS": lab_variants(course_key(course.root), "ana.b@uni")}
    assert json.loads(given["CTC_VARIANTS"])["student"] == "ana.b@uni"
    assert workspace_variants(course, workspace) == given  # remembered
    for bad in ("", "../x", "a b", "x" * 101):
        with pytest.raises(CourseError, match="is not a student id"):
            workspace_variants(course, workspace, bad)
    assert workspace_variants(course, workspace) == given


def test_on_a_machine_of_their_own_a_student_gets_their_numbers_from_their_code(tmp_path) -> None:
    """The instructor's `variants` command gives a code per student; the student's lab, with a
    course directory (and key) of its own, takes their numbers from it, as the grader draws
    them, and remembers it. A code of another version of the course is refused."""
    import json

    from grader.common.errors import CourseError
    from grader.content.variants import course_key, lab_variants
    from grader.course import Course
    from grader.lab.server import workspace_variants

    instructor = Course(tmp_path / "course", log=lambda _: None)
    course_key(instructor.root, create=True)
    printed = grader("variants", "ana", "ben", "--course-dir", instructor.root).stdout
    codes = dict(line.split("\t") for line in printed.splitlines())
    assert set(codes) == {"ana", "ben"}
    own = Course(tmp_path / "laptop", log=lambda _: None)  # the student's own course directory
    workspace = tmp_path / "ws"
    given = workspace_variants(own, workspace, "ana", codes["ana"])
    assert json.loads(given["CTC_VARIANTS"]) == json.loads(
        lab_variants(course_key(instructor.root), "ana"))
    assert workspace_variants(own, workspace) == given  # remembered
    for bad in (codes["ana"][:-1], codes["ana"] + "0", "not a code", codes["ana"][:-1] + "z"):
        with pytest.raises(CourseError, match="not a code of this course's version"):
            workspace_variants(own, workspace, "ana", bad)
    with pytest.raises(CourseError, match="--code goes with --student"):
        workspace_variants(own, tmp_path / "fresh", code=codes["ana"])
    done = grader("variants", "--course-dir", tmp_path / "empty", check=False)
    assert done.returncode == 2 and "release a lesson first" in done.stderr


def workspace_of_one_lesson(tmp_path):
    """A course, a student's workspace holding its first lesson, and what the course said: the
    lab releases the lesson, as on a student's first `make lab`."""
    from grader.course import Course
    from grader.lab.server import prepare_workspace

    said: list[str] = []
    course = Course(tmp_path / "course", log=said.append)
    lesson = all_lessons()[0]
    workspace = tmp_path / "workspace"
    prepare_workspace(course, workspace, [lesson])
    return course, lesson, workspace, said


def change_the_release(course, lesson):
    """The course changes the lesson (a newer release); its path."""
    released = course.root / "release" / lesson.name / lesson.notebook.name
    released.write_text(released.read_text() + " ")
    released.touch()
    return released


def test_a_newer_course_version_is_announced_only_when_there_is_one(tmp_path) -> None:
    from grader.lab.server import prepare_workspace, reset_lessons

    course, lesson, workspace, said = workspace_of_one_lesson(tmp_path)
    assert f"releasing {lesson.name}" in said
    mine = workspace / lesson.name / lesson.notebook.name
    mine.write_text(mine.read_text().replace("raise NotImplementedError()", "return 42", 1))
    said.clear()
    prepare_workspace(course, workspace, [lesson])
    assert not any("newer" in line for line in said), said  # edited, but the course is not newer

    change_the_release(course, lesson)
    said.clear()
    prepare_workspace(course, workspace, [lesson])
    assert any("newer version" in line and f"--reset {lesson.name}" in line for line in said)
    assert "return 42" in mine.read_text()  # never overwritten

    reset_lessons(course, workspace, [lesson])
    prepare_workspace(course, workspace, [lesson])
    kept = [p for p in workspace.iterdir() if p.name.startswith(f"{lesson.name}.before-reset-")]
    assert len(kept) == 1 and "return 42" in (kept[0] / lesson.notebook.name).read_text()
    assert "return 42" not in mine.read_text()


def test_an_unedited_copy_follows_the_course(tmp_path) -> None:
    """And each copy carries the language_info this lab's kernels report, so that JupyterLab,
    which writes it when the kernel starts, does not show a notebook just opened as unsaved."""
    import nbformat
    from ipykernel.ipkernel import IPythonKernel

    from grader.lab.server import prepare_workspace, student_copy

    course, lesson, workspace, said = workspace_of_one_lesson(tmp_path)
    mine = workspace / lesson.name / lesson.notebook.name
    assert nbformat.read(mine, as_version=4).metadata.language_info == \
        IPythonKernel.language_info
    released = change_the_release(course, lesson)
    said.clear()
    prepare_workspace(course, workspace, [lesson])
    assert mine.read_bytes() == student_copy(released)
    assert any(line.startswith("updated:") for line in said)
    said.clear()
    prepare_workspace(course, workspace, [lesson])
    assert said == []  # the same version again: nothing to say


@pytest.mark.slow
def test_progress_lists_each_exercise_of_the_students_copies(tmp_path, shared_tmp) -> None:
    from grader.course import Course
    from grader.lab.server import prepare_workspace

    lesson = all_lessons()[0]
    workspace = tmp_path / "workspace"
    course = released_course([lesson], shared_tmp, tmp_path / "course")
    prepare_workspace(Course(course, log=lambda _: None), workspace, [lesson])
    mine = workspace / lesson.name / lesson.notebook.name
    import nbformat

    nb = nbformat.read(mine, as_version=4)
    reference = nbformat.read(lesson.notebook, as_version=4)
    by_id = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in reference.cells}
    from nbformat.v4 import new_output

    for cell in nb.cells:  # the student has done split_bits, and nothing else
        if cell.metadata.get("nbgrader", {}).get("grade_id") in ("FloatFormat", "split_bits"):
            cell.source = by_id[cell.metadata.nbgrader.grade_id].source
        if "variant" in cell.metadata.get("nbgrader", {}).get("grade_id", ""):  # run, no id set
            cell.outputs = [new_output("display_data", data={"text/plain": "Your numbers: ..."},
                                       metadata={"counting_the_cost": {"variant": {
                                           "exercise": f"{lesson.name}/predicted_bf16_stall",
                                           "student": None, "index": 0, "course": ""}}})]
    nbformat.write(nb, mine)
    (workspace / ".student").write_text('{"student": "s-9", "code": null}')  # as lab --student
    done = grader("progress", lesson.name, "--workspace", workspace, "--course-dir", course)
    assert "asks about the numbers drawn for s-9" in done.stdout  # its kernels had them
    assert "passes   split_bits" in done.stdout and "to do    decode" in done.stdout
    exercises = sum(1 for c in reference.cells if c.metadata.get("nbgrader", {}).get("grade"))
    # the graded prediction apart: its point is in no total
    assert f"2 of {exercises - 1} exercises pass their visible checks (2 of" in done.stdout
    assert "graded prediction, predicted_bf16_stall, is still to do (1 point)" in done.stdout
    # saved on the defaults, now with an id: said, with what to re-run
    assert ("worked on other numbers than yours: its numbers are the course's default ones "
            "(it was worked without a student id), not the ones drawn for s-9") in done.stdout
    assert 'Run the cell that prints "Your numbers" again' in done.stdout
    assert "Hidden checks also run" in done.stdout


def test_each_demo_serves_its_lesson_alone_in_a_workspace_of_its_own(tmp_path) -> None:
    from grader.course import Course
    from grader.lab.server import demo_command, lab_command, prepare_demo

    course = Course(tmp_path / "course", log=lambda _: None)
    commands = {}
    for lesson in all_lessons()[:2]:
        target = prepare_demo(course, lesson)
        commands[lesson.name] = demo_command(course, lesson, target)
        assert f"--ServerApp.root_dir={target}" in commands[lesson.name]
        assert sorted(p.name for p in target.iterdir() if p.suffix == ".ipynb") == [
            lesson.notebook.name]
    workspaces = [next(a for a in argv if a.startswith("--LabApp.workspaces_dir="))
                  for argv in commands.values()]
    assert len(set(workspaces)) == 2  # two demos never share open tabs
    assert not any(a.startswith("--LabApp.workspaces_dir") for a in lab_command(tmp_path))


def test_the_validate_buttons_build_is_made_from_its_sources() -> None:
    """The course's Validate button is committed built (students need no Node.js): the build
    records the digest of the sources it was made from, and a change to the sources without
    `make labextension` fails here."""
    import json

    from grader.lab.server import LAB_EXTENSIONS, VALIDATE_PLUGIN, button_sources

    recorded = (LAB_EXTENSIONS.parent.parent / "built-from.txt").read_text().strip()
    assert recorded == button_sources(), "the button's sources changed: run make labextension"
    built = LAB_EXTENSIONS / VALIDATE_PLUGIN
    entry = json.loads((built / "package.json").read_text())["jupyterlab"]["_build"]["load"]
    assert (built / entry).is_file()
    assert "counting-the-cost/validate" in "".join(
        p.read_text() for p in (built / "static").glob("*.js"))


@pytest.mark.parametrize("role", ["student", "instructor"])
def test_the_hubs_lab_servers_load_the_validate_button_and_its_server_side(role) -> None:
    """Each hub role's configuration, read as a Jupyter server reads it, names the folder
    where the button's build lies and turns on its server side (a moved folder once left the
    hub's students without a Validate button)."""
    import json
    import runpy
    from types import SimpleNamespace

    from grader.lab.server import VALIDATE_PLUGIN

    folder = Path(__file__).resolve().parent.parent / "deploy" / "hub" / role
    config = SimpleNamespace(LabApp=SimpleNamespace())
    runpy.run_path(str(folder / "jupyter_server_config.py"),
                   init_globals={"get_config": lambda: config})
    (path,) = config.LabApp.extra_labextensions_path
    assert (Path(path) / VALIDATE_PLUGIN / "package.json").is_file()
    enabled = json.loads((folder / "jupyter_server_config.json").read_text())
    assert enabled["ServerApp"]["jpserver_extensions"]["grader.lab.validate"] is True


def test_one_instruction_for_setting_ones_id_is_given_word_for_word_everywhere() -> None:
    """The README, the student's guide, the hub's guide and the top of every lesson give the
    same instruction (grader/content/notebook_checks.py's SET_YOUR_ID), which every lesson's
    checks cell prints when no id is set and `make lab` prints too (the smoke test above); no
    other wording of it is left."""
    import nbformat

    from grader.content.lessons import REPO
    from grader.content.notebook_checks import SET_YOUR_ID

    def plain(text: str) -> str:
        return " ".join(text.replace("`", "").split())

    for path in ("README.md", "docs/student.md", "docs/hub.md"):
        text = (REPO / path).read_text()
        assert SET_YOUR_ID in plain(text), path
        assert "--student YOUR_ID" not in text and "STUDENT=YOUR_ID" not in text, path
    for lesson in all_lessons():
        nb = nbformat.read(lesson.notebook, as_version=4)
        assert SET_YOUR_ID in plain(nb.cells[0].source), lesson.name
        [checks] = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")
                    == "checks"]
        assert "SET_YOUR_ID = (" in checks.source and "print(whose_numbers())" in checks.source
