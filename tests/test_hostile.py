"""Careless, broken and hostile submissions, graded in one batch through the command line.

Each case is lesson 01's instructor notebook with something done to it, and the outcome it must
get: the points it earned (never more), and whether it is flagged. Two honest students in the
same batch must get exactly the grades they would get alone.
"""

from __future__ import annotations

import copy
import csv
import json
from collections.abc import Callable
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from grader.lessons import load_lesson
from grader.sandbox import bwrap_path
from tests.grading_helpers import cell, grader, points, read_export, submit

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hostile"),
              pytest.mark.skipif(bwrap_path() is None, reason="grading hostile code needs "
                                 "bubblewrap (make test installs it where it can)")]

LESSON = load_lesson("01_float_formats")
FULL = sum(points(nbformat.read(LESSON.notebook, as_version=4)).values())
PTS = points(nbformat.read(LESSON.notebook, as_version=4))
REPO = Path(__file__).resolve().parent.parent
Mutation = Callable[[nbformat.NotebookNode, Path], None]


def append(code: str) -> Mutation:
    def mutate(nb: nbformat.NotebookNode, course: Path) -> None:
        nb.cells.append(new_code_cell(code.replace("COURSE", str(course)).replace(
            "REPO", str(REPO))))
    return mutate


def replace(name: str, code: str, extra: str = "") -> Mutation:
    def mutate(nb: nbformat.NotebookNode, course: Path) -> None:
        cell(nb, name).source = code
        if extra:
            nb.cells.append(new_code_cell(extra))
    return mutate


WRONG_EPSILON = "def machine_epsilon(fmt):\n    return 2.0 ** -(fmt.mantissa_bits + 1)"


def drop_test_cells(nb, course) -> None:
    nb.cells = [c for c in nb.cells if not c.metadata.get("nbgrader", {}).get("grade")]


def move_test_cells_first(nb, course) -> None:
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    nb.cells = tests + [c for c in nb.cells if c not in tests]


def retarget_test_cells(nb, course) -> None:
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade"):
            c.metadata.nbgrader["grade_id"] = "test-decode"


def inflate_points(nb, course) -> None:
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade"):
            c.metadata.nbgrader["points"] = 1000
    fake = new_code_cell("pass")
    fake.metadata["nbgrader"] = {"grade": True, "grade_id": "test-bonus", "locked": True,
                                 "points": 100, "schema_version": 3, "solution": False,
                                 "task": False}
    nb.cells.append(fake)


EQ_TRICK = '''class Yes(float):
    def __eq__(self, other):
        return True
    __hash__ = float.__hash__


def decode(bits, fmt):
    return Yes(0.0)'''

STEAL_EXPECTED = '''import sys


def decode(bits, fmt):
    frame = sys._getframe(1)
    while frame is not None and "expected" not in frame.f_locals:
        frame = frame.f_back
    return frame.f_locals["expected"] if frame is not None else 0.0'''

AST_TRANSFORMER = '''import ast


class DropChecks(ast.NodeTransformer):
    def visit_Expr(self, node):
        call = node.value
        if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "check":
            return ast.Pass()
        return node


get_ipython().ast_transformers.append(DropChecks())'''

READ_SECRETS = '''import glob, os
found = []
for pattern in ["COURSE/gradebook.db", "COURSE/source/*/*.ipynb", "COURSE/submitted/*/*/*",
                "REPO/solutions/*.py", "REPO/notebooks/*/*.ipynb", "/root/*"]:
    found += glob.glob(pattern)
print("visible:", found)
for path in ["COURSE/gradebook.db", "REPO/solutions/floats.py"]:
    try:
        open(path, "a").write("tampered")
    except OSError as error:
        print(type(error).__name__)
try:
    open("REPO/pwned_by_student", "w").write("x")
except OSError as error:
    print(type(error).__name__)
assert found == [], found'''

# (student id, what is done to the notebook, expected score, expected status or None for
# either, a word the reason must contain or None)
CASES: list[tuple[str, Mutation | str, float, str | None, str | None]] = [
    ("honest", append("pass"), FULL, "graded", None),
    ("honest_one_wrong", replace("machine_epsilon", WRONG_EPSILON), FULL - 1, "graded", None),
    ("loops_forever", append("while True:\n    pass"), FULL, "needs_review", "time limit"),
    ("swallows_interrupts", append(
        "import time\nwhile True:\n    try:\n        time.sleep(5)\n"
        "    except KeyboardInterrupt:\n        pass"), FULL, "needs_review", "time limit"),
    ("exhausts_memory", append("hog = bytearray(64 * 2**30)"), FULL, "graded", None),
    ("fork_bomb", append(
        "import os\nfor _ in range(100000):\n    if os.fork() == 0:\n        while True:\n"
        "            pass"), FULL, "needs_review", "subprocesses"),
    ("kills_kernel", append("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"), FULL,
     "needs_review", "stopped the kernel"),
    ("os_exit", append("import os\nos._exit(3)"), FULL, "needs_review", "stopped the kernel"),
    ("calls_exit", append("exit()"), FULL, "needs_review", "stopped the kernel"),
    ("calls_exit_early", lambda nb, course: nb.cells.insert(5, new_code_cell("quit()")), FULL,
     "needs_review", "cell 5: this cell stopped the kernel"),
    ("floods_output", append("while True:\n    print('x' * 100000)"), FULL, "needs_review",
     None),
    ("asks_input", append("name = input('your name? ')"), FULL, "graded", None),
    ("invalid_json", "{not json", 0.0, "invalid", "not a readable notebook"),
    ("missing", "", 0.0, "invalid", "no notebook"),
    ("renamed", "rename", FULL, "needs_review", "in place of"),
    ("deleted_tests", drop_test_cells, FULL, None, None),
    ("moved_tests", move_test_cells_first, FULL, None, None),
    ("retargeted_tests", retarget_test_cells, FULL, None, None),
    ("inflated_points", inflate_points, FULL, None, None),
    # The forged decode also sends a demo cell's loop round forever: that cell is skipped.
    ("eq_trick", replace("decode", EQ_TRICK), FULL - PTS["decode"], None, None),
    ("steals_expected", replace("decode", STEAL_EXPECTED), FULL - PTS["decode"],
     "needs_review", "frames"),
    ("patched_check", replace("machine_epsilon", WRONG_EPSILON + "\n\n\ncheck = print"),
     FULL - 1, "needs_review", "check helper"),
    ("ast_transformer", replace("machine_epsilon", WRONG_EPSILON, AST_TRANSFORMER), FULL - 1,
     "needs_review", "transformers"),
    ("patched_builtins", replace("machine_epsilon", WRONG_EPSILON,
                                 "import builtins\nbuiltins.type = lambda value: float"),
     None, "needs_review", "builtins"),
    ("patched_torch", replace("decode_tensor", "def decode_tensor(bits, fmt):\n"
                              "    return torch.zeros(bits.shape)",
                              "torch.equal = lambda *args: True\n"
                              "torch.Tensor.__eq__ = lambda *args: True"),
     FULL - PTS["decode_tensor"], "graded", None),
    ("forged_results", replace("machine_epsilon", WRONG_EPSILON,
                               'print(\'[{"t": "float", "v": "0x1.0p-10"}]\' * 3)'),
     FULL - 1, "graded", None),
    ("hangs_in_function", replace("smallest_normal",
                                  "def smallest_normal(fmt):\n    while True:\n        pass"),
     FULL - 1, "needs_review", "time limit"),
    ("reads_secrets", append(READ_SECRETS), FULL, "needs_review", "file system"),
    ("uses_network", append(
        "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)"), FULL,
     "needs_review", "network"),
    ("runs_subprocess", append(
        "import subprocess\nsubprocess.run(['touch', 'REPO/pwned_by_student'])"), FULL,
     "needs_review", "subprocesses"),
    ("shadows_modules", "shadow", FULL, "graded", None),
]


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    course, submissions = tmp / "course", tmp / "submissions"
    grader("release", LESSON.name, "--course-dir", course)
    instructor = nbformat.read(LESSON.notebook, as_version=4)
    for student, mutation, *_ in CASES:
        folder = submissions / student
        folder.mkdir(parents=True)
        if mutation == "{not json":
            (folder / LESSON.notebook.name).write_text(mutation)
        elif mutation == "rename":
            nbformat.write(instructor, folder / "my_float_formats_final.ipynb")
        elif mutation == "shadow":
            nbformat.write(instructor, folder / LESSON.notebook.name)
            for module in ("torch.py", "sitecustomize.py", "math.py"):
                (folder / module).write_text("raise SystemExit('shadowed')\n")
        elif callable(mutation):
            nb = copy.deepcopy(instructor)
            mutation(nb, course)
            submit(submissions, student, nb, LESSON.notebook.name)
    done = grader("autograde", LESSON.name, submissions, "--course-dir", course, "--jobs", "2",
                  "--cell-timeout", "20", "--timeout", "150")
    grader("export", "--course-dir", course, "--csv", tmp / "grades.csv")
    return {"done": done, "grades": read_export(tmp / "grades.csv"), "course": course,
            "status": json.loads((course / "grading_status.json").read_text())[LESSON.name]}


def test_there_are_at_least_twenty_hostile_cases() -> None:
    assert len(CASES) >= 22 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("student", "expected_score", "expected_status", "reason"),
                         [(c[0], c[2], c[3], c[4]) for c in CASES], ids=[c[0] for c in CASES])
def test_each_submission_gets_what_it_earned_and_no_more(batch, student, expected_score,
                                                         expected_status, reason) -> None:
    row = batch["grades"][(student, LESSON.name)]
    score = float(row["score"])
    if expected_score is None:  # sabotaged its own grading: it may lose points, never gain
        assert score <= FULL - 1
    else:
        assert score == expected_score, row
    assert float(row["max_score"]) == FULL
    if expected_status is not None:
        assert row["status"] == expected_status, row
    if reason is not None:
        assert reason in row["reason"], row


def test_the_batch_finishes_and_reports_every_student(batch) -> None:
    assert f"of {len(CASES)}" in batch["done"].stdout
    assert set(batch["status"]) == {c[0] for c in CASES}


def test_nothing_outside_the_sandbox_was_touched(batch) -> None:
    assert not (REPO / "pwned_by_student").exists()
    assert "tampered" not in (REPO / "solutions" / "floats.py").read_text()
    status = batch["status"]["reads_secrets"]
    assert status["exercises"]["decode"]["points"] == PTS["decode"]


def test_grading_without_bubblewrap_is_refused_unless_asked(tmp_path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    (tmp_path / "s" / "someone").mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "grader", "autograde", LESSON.name,
                           str(tmp_path / "s"), "--course-dir", str(tmp_path / "c")],
                          cwd=REPO, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "bubblewrap" in done.stderr and "--no-sandbox" in done.stderr


def test_report_gives_pass_rates_a_histogram_and_the_flagged(batch) -> None:
    done = grader("report", LESSON.name, "--course-dir", batch["course"])
    folder = batch["course"] / "reports" / LESSON.name
    with (folder / "pass_rates.csv").open() as handle:
        rates = {row["exercise"]: row for row in csv.DictReader(handle)}
    assert set(rates) == set(PTS)
    ran = sum(1 for record in batch["status"].values() if record.get("exercises"))
    assert all(int(row["graded"]) == ran for row in rates.values())
    # Five cases answer machine_epsilon wrongly; the decode ones lose decode, not epsilon.
    assert int(rates["machine_epsilon"]["passed"]) <= ran - 5
    assert int(rates["decode"]["passed"]) <= ran - 2
    assert (folder / "scores.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with (folder / "flagged.csv").open() as handle:
        flagged = {row["student_id"]: row for row in csv.DictReader(handle)}
    assert "loops_forever" in flagged and "time limit" in flagged["loops_forever"]["reason"]
    assert flagged["invalid_json"]["status"] == "invalid"
    assert "honest" not in flagged
    assert "machine_epsilon" in done.stdout
