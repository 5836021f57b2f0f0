"""Grade a synthetic class and compare with plain serial ``nbgrader autograde``.

    .venv/bin/python benchmarks/grade_class.py [--students 60] [--jobs 2] [--lesson LESSON]

The class mixes correct submissions, partial ones (one exercise wrong), untouched student
versions and broken ones (a cell that loops, a cell that kills the kernel, invalid JSON). It
prints the wall time of `python -m grader autograde --jobs N` (sandboxed), submissions per
minute, the same for serial `nbgrader autograde` on the same submissions, and how close the
grader comes to the ideal: the sum of the notebooks' own run times divided by the jobs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from grader.content.lessons import load_lesson  # noqa: E402


def build_class(lesson, release_nb: Path, folder: Path, students: int) -> None:
    instructor = nbformat.read(lesson.notebook, as_version=4)
    untouched = nbformat.read(release_nb, as_version=4)
    solution_cells = [c for c in instructor.cells if c.metadata.get("nbgrader", {}).get("solution")]
    for number in range(students):
        kind = ["correct", "correct", "partial", "untouched", "loops", "kills", "invalid"][
            number % 7]
        target = folder / f"student{number:03d}"
        target.mkdir(parents=True)
        path = target / lesson.notebook.name
        if kind == "invalid":
            path.write_text("{not a notebook")
            continue
        nb = copy.deepcopy(untouched if kind == "untouched" else instructor)
        if kind == "partial":
            victim = solution_cells[number % len(solution_cells)].metadata.nbgrader.grade_id
            for cell in nb.cells:
                if cell.metadata.get("nbgrader", {}).get("grade_id") == victim:
                    cell.source = cell.source.split("### BEGIN SOLUTION")[0] + \
                        "    raise NotImplementedError()"
        elif kind == "loops":
            nb.cells.append(new_code_cell("while True:\n    pass"))
        elif kind == "kills":
            nb.cells.append(new_code_cell("import os\nos._exit(1)"))
        nbformat.write(nb, path)


def timed(command: list[str], cwd: Path) -> float:
    """Seconds ``command`` took. Its exit status is not checked: plain nbgrader exits 1 when
    some submissions failed (the invalid ones here), after grading all of them."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, check=False, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--students", type=int, default=60)
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--lesson", default="01_float_formats")
    parser.add_argument("--cell-timeout", type=int, default=20)
    parser.add_argument("--skip-nbgrader", action="store_true")
    args = parser.parse_args()
    lesson = load_lesson(args.lesson)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        course, submissions = tmp / "course", tmp / "submissions"
        python = [sys.executable, "-m", "grader"]
        subprocess.run([*python, "release", lesson.name, "--course-dir", str(course)],
                       cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        build_class(lesson, course / "release" / lesson.name / lesson.notebook.name,
                    submissions, args.students)
        ours = timed([*python, "autograde", lesson.name, str(submissions), "--course-dir",
                      str(course), "--jobs", str(args.jobs), "--cell-timeout",
                      str(args.cell_timeout)], REPO)
        ledger = json.loads((course / "grading_status.json").read_text())[lesson.name]
        own = sum(r.get("seconds", 0.0) for r in ledger.values())
        print(f"{args.students} submissions of {lesson.name}, {args.jobs} job(s), sandboxed")
        print(f"  python -m grader autograde: {ours:7.1f} s  "
              f"{60 * args.students / ours:6.1f} submissions/min")
        print(f"  notebooks' own run time / jobs: {own / args.jobs:7.1f} s  "
              f"(grader wall time is {ours / (own / args.jobs):.2f}x that)")
        if args.skip_nbgrader:
            return
        plain = tmp / "plain"  # stock nbgrader: its own config, serial, no sandbox
        plain.mkdir()
        (plain / "nbgrader_config.py").write_text(
            f"c = get_config()\nc.CourseDirectory.root = {str(plain)!r}\n"
            f"c.Execute.timeout = {args.cell_timeout}\n")
        shutil.copytree(course / "source", plain / "source")
        subprocess.run([sys.executable, "-m", "nbgrader", "generate_assignment", lesson.name,
                        "--force"], cwd=plain, check=True, capture_output=True)
        for student in submissions.iterdir():
            target = plain / "submitted" / student.name / lesson.name
            target.mkdir(parents=True)
            for file in student.iterdir():
                shutil.copyfile(file, target / file.name)
        theirs = timed([sys.executable, "-m", "nbgrader", "autograde", lesson.name], plain)
        print(f"  nbgrader autograde (serial): {theirs:7.1f} s  "
              f"{60 * args.students / theirs:6.1f} submissions/min")
        print(f"  speed-up over serial nbgrader: {theirs / ours:.2f}x")


if __name__ == "__main__":
    main()
