"""Time ``python -m grader similarity`` on a synthetic class, and check it finds what was planted.

    .venv/bin/python benchmarks/similarity_class.py [--students 300] [--lesson LESSON] [--cpus 0,1]

The class is built without grading it (similarity reads only the stored notebooks and the
ledger's statuses): each student's answer cells are the reference solution with lines of
their own inserted at random (so that they share the obvious fragments with everyone, and
little else), a tenth hand in some exercises untouched, and a few pairs are planted: copies
with every variable renamed, and notebooks with the same bytes. The command runs pinned to
``--cpus`` (default the first two), as a class's grader on a 2-core laptop would. Prints the
wall time, the grading process's peak memory and what was found against what was planted,
with the defaults, then again with ``--ignore-common 0`` (every fragment kept, the slowest
case: every pair shares something; run for classes up to 2,000).
"""

from __future__ import annotations

import argparse
import copy
import csv
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from grader.content.lessons import load_lesson  # noqa: E402
from grader.course import Course  # noqa: E402
from grader.gradebook import ledger  # noqa: E402

PLANTED_COPIES = 10
PLANTED_IDENTICAL = 3
EVERY_FRAGMENT_UP_TO = 2_000  # students: the --ignore-common 0 case counts every pair
PEAK = ("import resource, runpy, sys; sys.argv = ['grader', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('grader', run_name='__main__')\n"
        "finally:\n    print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,"
        " file=sys.stderr)\n")


def perturbed(source: str, rng: random.Random) -> str:
    """The solution with lines of the student's own inserted (unique numbers: unique k-grams)."""
    lines = source.splitlines()
    out = []
    for line in lines:
        out.append(line)
        if rng.random() < 0.35:
            indent = re.match(r"\s*", line).group()
            if line.rstrip().endswith(":"):
                indent += "    "
            out.append(f"{indent}scratch_{rng.randrange(10**6)} = {rng.randrange(10**9)} * "
                       f"{rng.randrange(10**9)} + len(str({rng.randrange(10**6)}))")
    return "\n".join(out)


def renamed(source: str, rng: random.Random) -> str:
    """Every identifier of the student's own renamed: what a copier does first."""
    names = set(re.findall(r"\b(scratch_\d+|bits|fmt|value|result|mantissa|exponent|sign)\b",
                           source))
    for name in names:
        source = re.sub(rf"\b{name}\b", f"{name}_x{rng.randrange(1000)}", source)
    return source


def build(course: Course, lesson, students: int, seed: int = 0) -> tuple[set, set]:
    rng = random.Random(seed)
    instructor = nbformat.read(lesson.notebook, as_version=4)
    release = nbformat.read(course.root / "release" / lesson.name / lesson.notebook.name,
                            as_version=4)
    stubs = {c.metadata.nbgrader.grade_id: c.source for c in release.cells
             if c.metadata.get("nbgrader", {}).get("solution")}
    notebooks: dict[str, nbformat.NotebookNode] = {}
    for number in range(students):
        nb = copy.deepcopy(instructor)
        for cell in nb.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            if cell.metadata.get("nbgrader", {}).get("solution"):
                cell.source = (stubs[grade_id] if number % 10 == 9 and rng.random() < 0.5
                               else perturbed(cell.source, rng))
        notebooks[f"s{number:03d}"] = nb
    copies, identical = set(), set()
    ids = sorted(notebooks)
    for k in range(PLANTED_COPIES):
        source, target = ids[2 * k], ids[2 * k + 1]
        nb = copy.deepcopy(notebooks[source])
        for cell in nb.cells:
            if cell.metadata.get("nbgrader", {}).get("solution"):
                cell.source = renamed(cell.source, rng)
        notebooks[target] = nb
        copies.add(tuple(sorted((source, target))))
    for k in range(PLANTED_IDENTICAL):
        source, target = ids[-2 - 2 * k], ids[-1 - 2 * k]
        notebooks[target] = notebooks[source]
        identical.add(tuple(sorted((source, target))))
    rows = []
    for student, nb in notebooks.items():
        path = course.root / "submitted" / student / lesson.name / lesson.notebook.name
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
        rows.append({"student_id": student, "status": "graded"})
    ledger.write(course.db_url, lesson.name, rows)
    return copies, identical


def run(root: Path, lesson, cpus: str, *extra: str) -> tuple[float, int, set, set]:
    started = time.perf_counter()
    done = subprocess.run(["taskset", "-c", cpus, sys.executable, "-c", PEAK, "similarity",
                           lesson.name, "--course-dir", str(root), *extra], cwd=REPO,
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"similarity failed:\n{done.stdout}\n{done.stderr}")
    peak = int(done.stderr.rsplit("PEAK_RSS_KB", 1)[1].split()[0]) * 1024
    found, same = set(), set()
    with (root / "reports" / lesson.name / "similarity.csv").open() as handle:
        for row in csv.DictReader(handle):
            pair = tuple(sorted((row["student_a"], row["student_b"])))
            (same if row["identical"] == "yes" else found).add(pair)
    return seconds, peak, found, same


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--students", type=int, default=300)
    parser.add_argument("--lesson", default="01_float_formats")
    parser.add_argument("--cpus", default="0,1")
    args = parser.parse_args()
    lesson = load_lesson(args.lesson)
    with tempfile.TemporaryDirectory() as tmp:
        course = Course(Path(tmp) / "course", log=lambda _: None)
        course.release(lesson)
        copies, identical = build(course, lesson, args.students)
        pairs = args.students * (args.students - 1) // 2
        print(f"{args.students} submissions of {lesson.name} ({pairs:,} pairs), "
              f"{len(copies)} planted renamed copies, {len(identical)} identical pairs; "
              f"pinned to CPUs {args.cpus} of {os.cpu_count()}")
        cases = [("defaults", ())]
        if args.students <= EVERY_FRAGMENT_UP_TO:
            cases.append(("--ignore-common 0", ("--ignore-common", "0")))
        else:
            print(f"--ignore-common 0 not run: every pair shares the reference solution's "
                  f"fragments, {pairs:,} pairs to count (run up to {EVERY_FRAGMENT_UP_TO:,})")
        for label, extra in cases:
            seconds, peak, found, same = run(course.root, lesson, args.cpus, *extra)
            print(f"{label:>18}: {seconds:6.1f} s wall (python start included), peak RSS "
                  f"{peak / 2**20:5.0f} MiB; renamed copies found {len(found & copies)}/"
                  f"{len(copies)}, other pairs listed {len(found - copies - identical)}, "
                  f"identical found {len(same & identical)}/{len(identical)}")


if __name__ == "__main__":
    main()
